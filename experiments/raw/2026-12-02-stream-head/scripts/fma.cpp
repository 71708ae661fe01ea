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
    __m512 a[12]; for(int i=0;i<12;i++) a[i]=_mm512_set1_ps(1.0f+i*1e-3f);
    __m512 b=_mm512_set1_ps(0.999999f), c=_mm512_set1_ps(1e-7f);
    for(long k=0;k<iters/12;k++){
      #pragma GCC unroll 12
      for(int i=0;i<12;i++) a[i]=_mm512_fmadd_ps(a[i],b,c);
    }
    float s=0; for(int i=0;i<12;i++) s+=_mm512_reduce_add_ps(a[i]);
    if(s==12345) printf("x");
  }
  double t=omp_get_wtime()-t0;
  printf("threads %d: %.1f GFLOP/s\n", nt, (double)(iters/12*12)*16*2*nt/t/1e9);
  }
}
