#!/bin/bash
# Megatron-LM（pretrain_gpt.py）里与显存有关的参数：Llama-7B 形状，2 台机器 × 8 张卡 = 16 张卡。
# 数据并行组数 d = 16 / (TP × PP × CP) = 16 / (4 × 2 × 1) = 2。
# 省略了数据、分词器、学习率、保存路径等与显存无关的参数。
GPUS_PER_NODE=8
NNODES=2

MODEL_ARGS=(
    --num-layers 32
    --hidden-size 4096
    --ffn-hidden-size 11008
    --num-attention-heads 32
    --seq-length 4096
    --max-position-embeddings 4096
    --swiglu
    --normalization RMSNorm
    --position-embedding-type rope
    --untie-embeddings-and-output-weights
)

MEMORY_ARGS=(
    --bf16                              # BF16 参数；梯度默认在 FP32 里累积和规约
    --tensor-model-parallel-size 4      # 张量并行：每层权重切 4 份（放在一台机器的 NVLink 之内）
    --sequence-parallel                 # 序列并行：把张量并行切不到的 LayerNorm/dropout 激活值也切 4 份
    --pipeline-model-parallel-size 2    # 流水线并行：32 层分成 2 段
    --use-distributed-optimizer         # 优化器状态（FP32 主权重、m、v）在数据并行组内分片，即 ZeRO-1
    --overlap-grad-reduce               # 梯度规约与反向计算重叠
    --overlap-param-gather              # 参数全收集与下一步的前向重叠
    --recompute-granularity selective   # 选择性重算：只重算注意力核心（--recompute-modules 默认 core_attn）
    # --recompute-granularity full --recompute-method uniform --recompute-num-layers 1   # 放不下时再用完整重算
    --micro-batch-size 1
    --global-batch-size 256
)

torchrun --nproc_per_node $GPUS_PER_NODE --nnodes $NNODES \
    pretrain_gpt.py "${MODEL_ARGS[@]}" "${MEMORY_ARGS[@]}"
