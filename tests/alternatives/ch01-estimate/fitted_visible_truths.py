# expect: incorrect
# 只适配公开用例：把 tiny 上 9 个组合的实测字节数（评分反馈里能看到）抄成一张表，不看 n_params。
# 公开的配置全对；隐藏配置换了模型，参数量不同，答案就错了。
TRUTHS = {
    ("sgd", "fp32"): 4747264, ("sgd", "bf16"): 2381824, ("sgd", "bf16-mixed"): 4747264,
    ("sgdm", "fp32"): 7120896, ("sgdm", "bf16"): 3572736, ("sgdm", "bf16-mixed"): 7120896,
    ("adamw", "fp32"): 9494528, ("adamw", "bf16"): 4763648, ("adamw", "bf16-mixed"): 9494528,
}


def estimate_static_bytes(n_params, optimizer, precision):
    return TRUTHS[optimizer, precision]
