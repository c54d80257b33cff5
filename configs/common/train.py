# Training options read by tools/train_net.py (winpos.d2.engine). Same keys as detectron2's common/train.py,
# plus seed, device="auto", amp.precision / amp.eval, grad_accum_steps, clip_grad, keep_best and freeze.
train = dict(
    output_dir="./output",
    init_checkpoint="",  # any format winpos imports: detector .pth/.pkl, MAE, Hiera, SAM, SAM2, timm
    max_iter=90000,
    amp=dict(enabled=False, precision="bf16", eval=False),  # precision: bf16 (no grad scaling) or fp16
    ddp=dict(broadcast_buffers=False, find_unused_parameters=False, fp16_compression=False),
    checkpointer=dict(period=5000, max_to_keep=100),
    eval_period=5000,
    eval_after_train=True,
    log_period=20,
    device="auto",  # cuda if available, else cpu
    seed=0,  # per-rank seed = seed + rank; also seeds the data stream's shuffling and augmentation
    cudnn_benchmark=False,
    grad_accum_steps=1,  # micro-batches per optimizer step: per-GPU images = total_batch_size / (GPUs x this)
    clip_grad=None,  # max global gradient norm, or None
    keep_best=None,  # e.g. "bbox/AP": keep the best periodic evaluation's weights in model_best.pth (winpos.d2.best)
    freeze=[],  # parameter-name prefixes not to train, or a preset: "trunk", "backbone", "heads" (winpos.d2.freeze)
)
