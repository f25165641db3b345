# expect: incorrect
# 反例（只修了一半）：优化器状态的份数数对了，但把 bf16-mixed 当成参数、梯度、状态都是 2 字节。
# autocast 不改变参数的 dtype：混合精度下模型状态与 FP32 一样大，这里少算了一半。
def estimate_static_bytes(n_params, optimizer, precision):
    width = 4 if precision == "fp32" else 2
    states = {"sgd": 0, "sgdm": 1, "adamw": 2}[optimizer]
    return n_params * width * (2 + states)
