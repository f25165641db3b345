"""第 24 章 用 peft 做 LoRA 微调（ch24-lora）.

Kind "finetune": `prepare_model(model)` gets the grader's Llama (random weights, on the device, every
parameter trainable) and returns the model to fine-tune; the grader trains it (AdamW over the
parameters that require grad) and measures the steady peak. The starter is full fine-tuning. The
task asks for LoRA on every linear layer of every decoder layer (QLoRA's finding), which the grader
checks (Settings.cover "every_linear"): the learner finds the module names in the model itself.
"""
from .spec import finetune_exercise

TARGET_NOTE = ("Measured on the sim at ci scale (llama-tiny 4 x 256, batch 2, seq 64; hidden: 5 x 224, 7/1 heads, "
               "seq 48), starter peak 65.4 MiB, ratios visible / hidden: the reference (seven names, r=8) "
               "0.387 / 0.372; all-linear 0.387 / 0.372; names read from the model, r=16 0.415 / 0.404 (share "
               "7.95% / 9.2%); regex, r=4, rsLoRA 0.373 / 0.356. Refused: the starter (technique), peft's default "
               "targets q/v only (0.337, technique: coverage), attention weights unfrozen by hand (technique), "
               "embed_tokens/lm_head in modules_to_save (share 16.4%, incorrect), init_lora_weights=False "
               "(first loss, incorrect), layers_to_transform=[0..3] or module paths of layers 0-3 (pass the "
               "visible case, technique on the hidden one). Target 0.50. "
               "`pytest tests/test_alternatives.py -k ch24`, 2026-12-02.")

SPEC = finetune_exercise(
    id="ch24-lora",
    chapter=24,
    title="LoRA：冻结基座，只训练低秩旁路",
    task=(
        "请把全量微调换成 **LoRA**（用 peft 库）：基座的权重全部冻结，只训练加在线性层旁边的低秩旁路。要求：\n\n"
        "- **覆盖每一个线性层**：每一层的注意力和 MLP 里的每一个线性层都要有旁路（QLoRA 论文的结论：只适配一部分矩阵"
        "追不上全量微调）。输出层和词嵌入不在此列，也不要让它们整个变成可训练的。这些线性层叫什么名字，要你自己从模型里找；\n"
        "- **从原模型出发**：旁路一开始的贡献必须是零，所以第 1 步的损失要与全量微调完全相同；训练几步后损失要下降；\n"
        "- **参数高效、省显存**：可训练参数占比和峰值显存都不超过下面的标准。"
    ),
    method="lora",
    same_start=True,
    cover="every_linear",
    target_ratio=0.5,
    catches=("a LoRA that names the visible layers (an index list or full module paths of layers 0-3, "
             "layers_to_transform=[0, 1, 2, 3]) leaves the extra layer without adapters; a hand-made "
             "adapter sized for hidden 256 does not fit"),
    giveaways=(r"LoraConfig", r"get_peft_model", r"all-linear", r"gate_proj|up_proj|down_proj"),
    hints=(
        "评分器说哪些线性层没有旁路？模型的每一层里一共有几个线性层，它们叫什么名字？"
        "（打印模型，或者遍历 `model.named_modules()` 看看。）",
        "peft 的 LoRA 配置按模块名字的后缀选目标：写出每一层里线性层的短名字，所有层的同名模块都会被适配，"
        "层数变了也不用改；也可以让它一次选中除输出层以外的全部线性层。旁路的 dropout 设为 0、不改 B 的初始化，"
        "第 1 步的损失才与全量微调相同。",
        "`return get_peft_model(model, LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, task_type=\"CAUSAL_LM\", "
        "target_modules=\"all-linear\"))`；`target_modules` 也可以写成 "
        "`[\"q_proj\", \"k_proj\", \"v_proj\", \"o_proj\", \"gate_proj\", \"up_proj\", \"down_proj\"]`。",
    ),
)
