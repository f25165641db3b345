# expect: incorrect
# 反例：照抄“每个参数 16 字节”这条结论，不管优化器和精度。只对 AdamW + FP32 / 混合精度成立，
# 不带动量的 SGD 只有一半，纯 BF16 也只有一半。
def estimate_static_bytes(n_params, optimizer, precision):
    return n_params * 16
