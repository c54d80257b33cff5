"""The reproduction of "Window Attention is Bugged" at CPU scale, above the detectron2 integration (``winpos.d2``).

Modules:

    protocol              sizes, encodings, rows, conditions and the spec of every run
    pretrain              stage 0: a unit-layout autoencoder that lets an absolute embedding learn a window pattern
    checkpoints           the conversions (abs-win, the control, the recursive form), hashes, window structure
    runs                  each run in its own process, identified by everything that made it
    child                 one run, in its own process (``python -m winpos.experiments.child SPEC_JSON``)
    archive               sealed results of finished runs, read back in any checkout
    stats                 paired differences per seed with 95% t-intervals
    report                the reproduction's summary, tables and plot
    reproduce             the whole protocol (``winpos-reproduce``)
    demo                  its short form on the embedded default (``winpos-demo``)
    vitdet                the ViTDet half of the reproduction (``winpos-reproduce --vitdet``)
    footing               the equal-footing study: its settings, the spec of every run, its declared views
    footing_runs          the equal-footing study's runs: started, archived, tidied and collected
    footing_analysis      the equal-footing study's declared tests
    footing_report        the equal-footing study's tables and figure
    equivalence_report    the declared equivalence study's text and figure
    precision             the declared mixed-precision study: the shipped detector in fp32, bf16 and fp16
                          (``winpos-reproduce --precision``)
    small_data            the declared small-data study: full finetuning vs a frozen trunk vs the RoI heads only
                          (``winpos-reproduce --small-data``)
    study_commands        the declared studies as ``winpos-reproduce`` runs and prints them
"""
