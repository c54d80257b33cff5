"""The reproduction of "Window Attention is Bugged" at CPU scale, above the detectron2 integration (``winpos.d2``):

* ``protocol``: sizes, encodings, rows, conditions and the spec of every run;
* ``pretrain``: stage 0, a unit-layout autoencoder (Hiera's MAE as a variant) that lets an absolute embedding learn a window pattern;
* ``checkpoints``: the conversions (abs-win, the control, the recursive form), hashes, window structure, export;
* ``runs`` / ``child``: each run in its own process, identified by everything that made it;
* ``stats`` / ``report``: paired differences per seed with 95% t-intervals, tables and plots;
* ``reproduce`` / ``demo``: the whole protocol (``tools/reproduce.py``) and its short form (``tools/run_demo.py``).
* ``footing`` / ``footing_analysis`` / ``footing_report``: the equal-footing study, its declared tests and report;
  ``equivalence_report``: the declared equivalence study's report (its specs and analysis live in the two before);
* ``archive``: sealed results of finished runs, read back in any checkout.
"""
