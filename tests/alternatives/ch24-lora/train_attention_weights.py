# expect: technique
# 半吊子：不用 LoRA，只冻结 MLP 和嵌入，注意力的权重整个照常训练。冻结了一部分模型，
# 但这不是 LoRA（返回的不是 peft 模型）。
def prepare_model(model):
    for name, p in model.named_parameters():
        p.requires_grad_("self_attn" in name)
    return model
