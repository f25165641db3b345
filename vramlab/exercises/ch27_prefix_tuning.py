"""第 27 章 用 peft 做 P-Tuning v2（ch27-prefix-tuning）.

Kind "finetune" with the method P-Tuning v2 = deep prompt tuning: trainable key/value prefixes at
every layer (Settings.cover "every_layer": as many prefix layers as the model has). The prefixes
change the first loss (no same-start check). The trainable budget (2%) is what the default
reparameterisation MLP breaks (4.2% at ci scale), the chapter's first rule for deep prompts.
"""
from .spec import finetune_exercise

TARGET_NOTE = ("Measured on the sim at ci scale (llama-tiny 4 x 256, batch 2, seq 64; hidden: 5 x 224, 7/1 heads, "
               "seq 48), ratios visible / hidden: the reference (16 tokens, no projection, share 0.48%) 0.342 / "
               "0.309; 64 tokens (1.88%) 0.368 / 0.314; projection with encoder_hidden_size=8 < 32 tokens "
               "(0.42%) 0.348 / 0.309. Refused: the default projection (share 4.21% > the 2% budget, "
               "incorrect; its peak, 0.366, would pass), prompt tuning (technique), num_layers=4 written by "
               "hand (exception on the hidden case). Target 0.50. "
               "`pytest tests/test_alternatives.py -k ch27`, 2026-12-02.")

SPEC = finetune_exercise(
    id="ch27-prefix-tuning",
    chapter=27,
    title="P-Tuning v2：每一层都有可训练的前缀",
    task=(
        "请把全量微调换成 **P-Tuning v2**（深度提示，用 peft 库）：模型冻结，**每一层**注意力的键和值前面都拼上一段"
        "可训练的前缀（不是只在输入端拼虚拟 token，那是上一章的提示微调）。要求：\n\n"
        "- **每一层都有前缀**：层数、键值头数和每头维度都要从模型本身读，隐藏配置里它们都不同；\n"
        "- **参数预算**：可训练参数不超过全部参数的 2%。前缀本身很小；P-Tuning v2 论文里用来稳定训练的重参数化网络"
        "却可能比前缀大得多，先算一算再决定要不要；\n"
        "- **在学习、省显存**：前缀改变了模型的输出，第 1 步的损失与全量微调不同，这一点不比较；"
        "训练几步后损失要下降，峰值显存要达标。"
    ),
    method="prefix_tuning",
    same_start=False,
    cover="every_layer",
    max_trainable_share=0.02,
    target_ratio=0.5,
    catches="a prefix sized by hand for the visible model (num_layers=4) misses a layer of the deeper one",
    giveaways=(r"PrefixTuningConfig", r"get_peft_model", r"prefix_projection"),
    hints=(
        "前缀加在哪里：输入端，还是每一层的注意力里？可训练参数超出预算时，多出来的是谁的参数？",
        "peft 有专门的前缀微调配置（它就是 P-Tuning v2 的深度提示）：给出虚拟 token 个数和任务类型（因果语言模型）即可，"
        "层数和键值维度它从模型的 config 里读（GQA 时按 KV 头算），自己填就会在别的形状上出错。"
        "它的重参数化投影默认关闭，保持关闭。",
        "`return get_peft_model(model, PrefixTuningConfig(num_virtual_tokens=16, task_type=\"CAUSAL_LM\"))`"
        "（`prefix_projection` 保持默认的 `False`）。",
    ),
)
