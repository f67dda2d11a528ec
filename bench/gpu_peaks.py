"""Device peaks and model FLOPs per token, shared by the GPU benchmarks (no torch needed).

`PEAK_BF16`: dense bf16 tensor-core peak FLOP/s by device name (vendor datasheets, no
sparsity). `flops_per_token`: PaLM's model FLOPs, 6 per non-position parameter plus
attention's 12 L C T.
"""

PEAK_BF16 = [
    ("H200", 989.4e12),
    ("H100 NVL", 835e12),
    ("H100 PCIe", 756e12),
    ("H100", 989.4e12),
    ("A100", 312e12),
]


def peak_flops(name):
    """The dense bf16 peak of the device called `name`, or None when it is not in the table."""
    for key, flops in PEAK_BF16:
        if key in name:
            return flops
    return None


def flops_per_token(n_params, wpe_numel, n_layer, n_embd, seq):
    """PaLM's model FLOPs: 6 per non-position parameter plus attention's 12 L H T."""
    return 6.0 * (n_params - wpe_numel) + 12.0 * n_layer * n_embd * seq
