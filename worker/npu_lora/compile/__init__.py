"""Device graphs compiled once, ahead of the run: the compile plan and the graph cache.

- ``plan`` (torch-free): every device graph a spec compiles, each with a content key;
- ``cache`` (torch-free): one directory per key, published atomically;
- ``precompile`` (torch): compile one graph of a plan into the cache; the worker's check.

Importing this package imports neither torch nor furiosa-torch. See ``docs/compile.md``.
"""
