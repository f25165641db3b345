# expect: technique
# 半吊子：冻结其余所有参数，只让整张词嵌入表可训练（以为这就是"训练输入端的嵌入"）。
# 可训练参数不算多、显存也降了，但这不是提示微调：没有虚拟 token，返回的也不是 peft 模型。
def prepare_model(model):
    for p in model.parameters():
        p.requires_grad_(False)
    model.get_input_embeddings().weight.requires_grad_(True)
    return model
