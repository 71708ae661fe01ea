#include <immintrin.h>
#include <chrono>
#include <cstdio>
#include <omp.h>
int main(){
  const long iters=200000000;
  double best=0;
  for(int nt=1;nt<=2;nt++){
  double t0=omp_get_wtime();
  #pragma omp parallel num_threads(nt)
  {
    __m256 a[12]; for(int i=0;i<12;i++) a[i]=_mm256_set1_ps(1.0f+i*1e-3f);
    __m256 b=_mm256_set1_ps(0.999999f), c=_mm256_set1_ps(1e-7f);
    for(long k=0;k<iters/12;k++){
      #pragma GCC unroll 12
      for(int i=0;i<12;i++) a[i]=_mm256_fmadd_ps(a[i],b,c);
    }
    float s=0; for(int i=0;i<12;i++) {float t[8]; _mm256_storeu_ps(t,a[i]); s+=t[0];}
    if(s==12345) printf("x");
  }
  double t=omp_get_wtime()-t0;
  printf("threads %d: %.1f GFLOP/s\n", nt, (double)(iters/12*12)*8*2*nt/t/1e9);
  }
}
