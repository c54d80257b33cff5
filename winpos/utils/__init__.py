"""winpos' plumbing: what the commands and every writer share, below all other layers (standard library and
``winpos.errors`` only; importing this package imports none of its modules, and none of them imports torch or
detectron2 at module import).

Modules:

    cli             the command-line policy: ``run_cli`` (one ``error:`` line and an exit status), ``error_line``,
                    ``ArgumentParser``, the argparse types, the upstream warning filters
    outputs         atomic writes, and the output checks every tool runs before any work
    output_folders  output folders claimed while a tool writes: lock, manifest, staging, no symbolic links
    config_names    the configs and the demo's checkpoint by name, in a checkout or installed
"""
