"""Benchmark harness: winpos and its peers timed interleaved in one process, reported as ratios.

Modules:

    timing              interleaved timing and peak-memory measurement, side by side in one run
    cuda_timing         GPU timing: CUDA events around each call, the L2 cache flushed between calls
    flops               FLOP counting (fvcore plus the attention ops) and the machine's matmul throughput
    profile             which ops a forward pass spends its time in (``torch.profiler``)
    peers               the models ``benchmark.py backbone`` times: winpos's and the implementations people use
    backbone            ``benchmark.py backbone``: winpos backbones against their peers
    posemb              ``benchmark.py posemb``: winpos relpos against materialized relpos
    scaling             ``benchmark.py scaling``: time and peak memory against input size, per encoding
    mlp                 ``benchmark.py mlp``: one transformer MLP, plain ops against the fused steps
    export              ``benchmark.py export``: exported models against eager
    train               ``benchmark.py train``: training throughput of the shapes Mask R-CNN per encoding
    train_step          ``benchmark.py train-step``: one training step of a whole backbone per encoding
    toy_step            ``benchmark.py toy-step``: what one reproduction run costs, part by part
    decode              image decoding, PIL against OpenCV (``winpos-bench-decode``)
    kernels             the fused Triton window attention against PyTorch SDPA at 1024 px shapes
    kernel_baselines    the implementations the fused kernels are timed against
    kernel_common       what the kernel benchmark and its sweep share
    kernel_sweep        the block-configuration sweep of the fused kernels, per shape
    gpu_check           the prepared GPU check (``tools/gpu_check.py OUT_DIR``)
    gpu_check_rows      one backbone row of the GPU check, in a child process with a hard deadline
    blocked_imports     rehearse the lent GPU image on a full machine: refuse what that image lacks
"""
