def estimate_static_bytes(n_params, optimizer, precision):
    """静态显存 = 参数 + 梯度 + 优化器状态，每一项都是“每个参数几字节”乘以参数量。
    - fp32：权重、梯度、状态都是 4 字节；
    - bf16（纯 bf16 训练）：三者都是 2 字节；
    - bf16-mixed（autocast 混合精度）：权重、梯度、状态仍是 fp32（4 字节），bf16 只用于激活值。
    优化器状态的份数：SGD 0 份，带动量的 SGD 1 份（momentum_buffer），AdamW 2 份（exp_avg、exp_avg_sq）。"""
    width = {"fp32": 4, "bf16": 2, "bf16-mixed": 4}[precision]
    states = {"sgd": 0, "sgdm": 1, "adamw": 2}[optimizer]
    return n_params * width * (1 + 1 + states)
