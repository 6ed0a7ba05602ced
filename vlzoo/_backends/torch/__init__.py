"""PyTorch's own code: `compiled` (`torch.jit.trace` of eager calls), `parallel` (`torch.distributed`:
DistributedDataParallel and a differentiable all-gather), `optimizers` (Adam's update through PyTorch's
fused kernel). Selected by `vlzoo._backends.running`."""
