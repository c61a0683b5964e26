"""tools/bench_train.py's reading of a profile: which category a CUDA kernel's name falls in, and the kernels that
took the most time (profile_split itself needs CUDA; these are the parts it reads every kernel through)."""

from tools.bench_train import kernel_category, top_kernels


def test_kernels_fall_in_their_categories_and_compiled_ones_first():
    names = {  # kernel names as torch's CUDA profiler records them
        "triton_red_fused__to_copy_amax_0": "compiled (Triton)",  # would match "copy" without its own category
        "triton_per_fused_add_mul_rsqrt_norm_1": "compiled (Triton)",
        "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<c10::BFloat16>>":
            "elementwise / copies",
        "nvjet_tst_128x256_64x4_2x1_v_bz_coopA_TNT": "matmul (linear layers)",
        "flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4>>": "attention",
        "void multi_tensor_apply_kernel<TensorListMetadata<4>, AdamFunctor<float>>": "optimizer",
        "fused_rope_forward_kernel": "rope (fused)",
        "void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<float>": "norms",
        "ncclDevKernel_AllReduce_Sum_f32_RING_LL": "communication",
        "some_custom_kernel": "other",
    }
    assert {name: kernel_category(name) for name in names} == names


def test_top_kernels_rank_by_device_time_and_cut_long_names():
    kernels = {"a": [2_000.0, 4], "b" * 150: [5_000_000.0, 10], "c": [30_000.0, 1]}
    assert top_kernels(kernels, n=2) == [("b" * 100, 5.0, 10), ("c", 0.03, 1)]
    assert [name for name, _, _ in top_kernels(kernels)] == ["b" * 100, "c", "a"]
