"""The GPUs the simulator's GPU presets cover: datasheet memory bandwidth, dense 16-bit tensor throughput and
memory, each with where it was read (worker.gpu_presets turns them into step models).

`bf16_flops` is the dense (no 2:4 sparsity) BF16 tensor-core rate with FP32 accumulation, the one a 16-bit
model's GEMMs run at; on GeForce cards that is half the FP16-accumulate figure their spec sheets lead with.
"""
from dataclasses import dataclass

GB = 1e9
TFLOPS = 1e12


@dataclass(frozen=True, slots=True)
class GPU:
    """One GPU's datasheet figures (bytes/s, FLOP/s, bytes)."""

    key: str
    name: str
    chip: str  # its GPU die (ga100, ga102, ad10x, gh100): GPUs of one die share their kernels' efficiency
    bandwidth_Bps: float
    bf16_flops: float
    memory_bytes: float
    source: str  # where the figures were read


GPUS: dict[str, GPU] = {g.key: g for g in (
    # 936 GB/s; FP16 tensor 142 TFLOPS dense with FP16 accumulate, GeForce runs FP32 accumulate (BF16) at half
    # the rate (hmc-tech.com lists the 3090 Ti at 159.99 vs 80 TFLOPS): 71 TFLOPS.
    GPU("rtx3090", "GeForce RTX 3090", "ga102", 936 * GB, 71 * TFLOPS, 24 * GB,
        "https://holynerdvana.blogspot.com/2022/10/nvidia-geforce-rtx-3090-specifications.html"),
    GPU("rtx4090", "GeForce RTX 4090", "ad10x", 1008 * GB, 165.2 * TFLOPS, 24 * GB,
        "https://gigagpu.com/?p=34220 (BF16/FP16 with FP32 accumulate, dense); https://waredb.com/processor/"
        "nvidia-geforce-rtx-4090"),
    GPU("l4", "L4", "ad10x", 300 * GB, 121 * TFLOPS, 24 * GB,
        "https://grokipedia.com/page/NVIDIA_L4_vs_L40S (300 GB/s; FP16 tensor 242 TFLOPS with sparsity: 121 dense)"),
    GPU("a100-40gb", "A100 40GB SXM4", "ga100", 1555 * GB, 312 * TFLOPS, 40 * GB,
        "https://glennklockwood.com/garden/processors/A100 (from NVIDIA's A100 datasheet)"),
    GPU("a100-80gb", "A100 80GB SXM4", "ga100", 2039 * GB, 312 * TFLOPS, 80 * GB,
        "https://glennklockwood.com/garden/processors/A100; https://www.thundercompute.com/blog/"
        "nvidia-a100-specs-full-guide (SXM 80GB: 2,039 GB/s)"),
    GPU("h100", "H100 80GB SXM5", "gh100", 3350 * GB, 989.4 * TFLOPS, 80 * GB,
        "https://glennklockwood.com/garden/processors/h100 (3.35 TB/s; BF16 matrix 989.4 TFLOPS dense)"),
    GPU("h200", "H200 141GB SXM", "gh100", 4800 * GB, 989.4 * TFLOPS, 141 * GB,
        "https://lzwjava.github.io/nvidia-h200-gpu-specs-en (4.8 TB/s, 141 GB; the H100's compute: "
        "https://glennklockwood.com/garden/processors/h100)"),
)}


def get_gpu(key: str) -> GPU:
    """A GPU by key, or ValueError naming the choices."""
    try:
        return GPUS[key]
    except KeyError:
        raise ValueError(f"unknown GPU {key!r} (choose from {', '.join(GPUS)})") from None
