"""第 26 章 用 peft 做 Prompt Tuning（ch26-prompt-tuning）.

Kind "finetune" with the method prompt tuning: only the virtual-token embeddings train. The
virtual tokens lengthen every sequence, so the first loss differs from full fine-tuning's (no
same-start check) and their number costs activations in every layer. The hidden shape is narrower:
virtual tokens sized by hand for the visible hidden size do not fit it.
"""
from .spec import finetune_exercise

TARGET_NOTE = ("Measured on the sim at ci scale (llama-tiny 4 x 256, batch 2, seq 64; hidden: 5 x 224, 7/1 heads, "
               "seq 48), ratios visible / hidden: the reference (16 virtual tokens) 0.358 / 0.345; 8 tokens "
               "through PeftModelForCausalLM 0.342 / 0.327; 32 tokens initialised from the vocabulary 0.390 / "
               "0.382; 64 tokens 0.454 / 0.455 (passes without the 10% margin). Refused: 200 tokens 0.727 "
               "(too_much_memory), the embedding table unfrozen by hand 0.356 (technique), prefix tuning "
               "(technique), token_dim=256 written by hand (exception on the hidden case). Target 0.50. "
               "`pytest tests/test_alternatives.py -k ch26`, 2026-12-02.")

SPEC = finetune_exercise(
    id="ch26-prompt-tuning",
    chapter=26,
    title="Prompt Tuning：只训练输入前面的几个虚拟 token",
    task=(
        "请把全量微调换成 **Prompt Tuning**（提示微调，用 peft 库）：模型的全部参数（包括词嵌入表）冻结，"
        "只训练拼在每条输入前面的若干个虚拟 token 的嵌入向量。要求：\n\n"
        "- **只训练虚拟 token**：它们的维度必须与模型的隐藏维度一致，隐藏配置的宽度不同，不能写死；\n"
        "- **虚拟 token 的个数由你定**：它让每条序列变长，每一层的激活值都随之增加，峰值显存要达标；\n"
        "- **在学习**：虚拟 token 改变了模型的输入，第 1 步的损失与全量微调不同，这一点不比较；训练几步后损失要下降。"
    ),
    method="prompt_tuning",
    same_start=False,
    target_ratio=0.5,
    catches=("virtual tokens sized by hand for the visible model (token_dim=256, num_layers=4) do not fit "
             "the narrower one"),
    giveaways=(r"PromptTuningConfig", r"get_peft_model"),
    hints=(
        "只训练输入端的几个向量，和把整个词嵌入表设成可训练，差在哪里？峰值超标时，序列实际变成了多长？",
        "peft 有专门的提示微调配置：只需要告诉它虚拟 token 的个数和任务类型（因果语言模型），维度和层数它从模型的 "
        "config 里读；自己填维度，换一个形状就出错。虚拟 token 取十几到几十个就够，太多只会多占激活值。",
        "`return get_peft_model(model, PromptTuningConfig(num_virtual_tokens=16, task_type=\"CAUSAL_LM\"))`。",
    ),
)
