// 由 `python -m vramlab.webdata` 从 vramlab 的 Python 代码生成，请勿手改。
window.VRAMLAB_CALC = {
 "presets": {
  "tiny": {
   "family": "gpt2",
   "note": "2 层 GPT-2，CPU 上一步训练远小于 1 秒",
   "fake_only": false,
   "n_layers": 2,
   "hidden": 128,
   "heads": 4,
   "kv_heads": 4,
   "vocab": 1024,
   "ffn_hidden": 512,
   "head_dim": 32,
   "positions": 512,
   "tie_word_embeddings": false,
   "num_local_experts": 0,
   "num_experts_per_tok": 1,
   "params": 593408
  },
  "gpt2-mini": {
   "family": "gpt2",
   "note": "4 层/512 维 GPT-2：参考表第二组校验用的模型",
   "fake_only": false,
   "n_layers": 4,
   "hidden": 512,
   "heads": 8,
   "kv_heads": 8,
   "vocab": 50257,
   "ffn_hidden": 2048,
   "head_dim": 64,
   "positions": 1024,
   "tie_word_embeddings": false,
   "num_local_experts": 0,
   "num_experts_per_tok": 1,
   "params": 38866432
  },
  "gpt2-small": {
   "family": "gpt2",
   "note": "GPT-2 small，124M 参数",
   "fake_only": false,
   "n_layers": 12,
   "hidden": 768,
   "heads": 12,
   "kv_heads": 12,
   "vocab": 50257,
   "ffn_hidden": 3072,
   "head_dim": 64,
   "positions": 1024,
   "tie_word_embeddings": false,
   "num_local_experts": 0,
   "num_experts_per_tok": 1,
   "params": 124439808
  },
  "gpt2-medium": {
   "family": "gpt2",
   "note": "GPT-2 medium，355M 参数",
   "fake_only": false,
   "n_layers": 24,
   "hidden": 1024,
   "heads": 16,
   "kv_heads": 16,
   "vocab": 50257,
   "ffn_hidden": 4096,
   "head_dim": 64,
   "positions": 1024,
   "tie_word_embeddings": false,
   "num_local_experts": 0,
   "num_experts_per_tok": 1,
   "params": 354823168
  },
  "gpt2-large": {
   "family": "gpt2",
   "note": "GPT-2 large，774M 参数",
   "fake_only": true,
   "n_layers": 36,
   "hidden": 1280,
   "heads": 20,
   "kv_heads": 20,
   "vocab": 50257,
   "ffn_hidden": 5120,
   "head_dim": 64,
   "positions": 1024,
   "tie_word_embeddings": false,
   "num_local_experts": 0,
   "num_experts_per_tok": 1,
   "params": 774030080
  },
  "gpt2-xl": {
   "family": "gpt2",
   "note": "GPT-2 XL，1.5B 参数",
   "fake_only": true,
   "n_layers": 48,
   "hidden": 1600,
   "heads": 25,
   "kv_heads": 25,
   "vocab": 50257,
   "ffn_hidden": 6400,
   "head_dim": 64,
   "positions": 1024,
   "tie_word_embeddings": false,
   "num_local_experts": 0,
   "num_experts_per_tok": 1,
   "params": 1557611200
  },
  "bert-tiny": {
   "family": "bert",
   "note": "2 层 BERT",
   "fake_only": false,
   "n_layers": 2,
   "hidden": 128,
   "heads": 2,
   "kv_heads": 2,
   "vocab": 1024,
   "ffn_hidden": 512,
   "head_dim": 64,
   "positions": 512,
   "tie_word_embeddings": false,
   "num_local_experts": 0,
   "num_experts_per_tok": 1,
   "params": 611456
  },
  "bert-base": {
   "family": "bert",
   "note": "BERT-base，110M 参数",
   "fake_only": false,
   "n_layers": 12,
   "hidden": 768,
   "heads": 12,
   "kv_heads": 12,
   "vocab": 30522,
   "ffn_hidden": 3072,
   "head_dim": 64,
   "positions": 512,
   "tie_word_embeddings": false,
   "num_local_experts": 0,
   "num_experts_per_tok": 1,
   "params": 109514298
  },
  "llama-tiny": {
   "family": "llama",
   "note": "2 层 Llama 结构：RMSNorm、SwiGLU、RoPE、GQA（4 个查询头共享 2 个 KV 头）",
   "fake_only": false,
   "n_layers": 2,
   "hidden": 128,
   "heads": 4,
   "kv_heads": 2,
   "vocab": 1024,
   "ffn_hidden": 344,
   "head_dim": 32,
   "positions": 512,
   "tie_word_embeddings": false,
   "num_local_experts": 0,
   "num_experts_per_tok": 1,
   "params": 625280
  },
  "llama-tiny-mqa": {
   "family": "llama",
   "note": "同上，但只有 1 个 KV 头（MQA）",
   "fake_only": false,
   "n_layers": 2,
   "hidden": 128,
   "heads": 4,
   "kv_heads": 1,
   "vocab": 1024,
   "ffn_hidden": 344,
   "head_dim": 32,
   "positions": 512,
   "tie_word_embeddings": false,
   "num_local_experts": 0,
   "num_experts_per_tok": 1,
   "params": 608896
  },
  "llama-1b": {
   "family": "llama",
   "note": "Llama-3.2-1B 形状（GQA 32/8）",
   "fake_only": true,
   "n_layers": 16,
   "hidden": 2048,
   "heads": 32,
   "kv_heads": 8,
   "vocab": 128256,
   "ffn_hidden": 8192,
   "head_dim": 64,
   "positions": 4096,
   "tie_word_embeddings": true,
   "num_local_experts": 0,
   "num_experts_per_tok": 1,
   "params": 1235814400
  },
  "llama-7b": {
   "family": "llama",
   "note": "Llama-2-7B 形状，6.7B 参数",
   "fake_only": true,
   "n_layers": 32,
   "hidden": 4096,
   "heads": 32,
   "kv_heads": 32,
   "vocab": 32000,
   "ffn_hidden": 11008,
   "head_dim": 128,
   "positions": 4096,
   "tie_word_embeddings": false,
   "num_local_experts": 0,
   "num_experts_per_tok": 1,
   "params": 6738415616
  },
  "moe-tiny": {
   "family": "mixtral",
   "note": "2 层 MoE（Mixtral 结构，4 个专家，每个 token 选 2 个）",
   "fake_only": false,
   "n_layers": 2,
   "hidden": 128,
   "heads": 4,
   "kv_heads": 2,
   "vocab": 1024,
   "ffn_hidden": 256,
   "head_dim": 32,
   "positions": 512,
   "tie_word_embeddings": false,
   "num_local_experts": 4,
   "num_experts_per_tok": 2,
   "params": 1148544
  }
 },
 "choices": {
  "optimizer": [
   "sgd",
   "sgdm",
   "adamw",
   "adamw8bit",
   "adafactor"
  ],
  "precision": [
   "fp32",
   "bf16",
   "fp16",
   "bf16-mixed",
   "fp16-mixed"
  ],
  "checkpointing": [
   "none",
   "full",
   "selective"
  ],
  "attention": [
   "sdpa",
   "eager"
  ],
  "offload": [
   "none",
   "activations"
  ],
  "lora_targets": [
   "default",
   "qkvo",
   "all-linear"
  ]
 },
 "keys": [
  "parameters",
  "gradients",
  "optimizer_state",
  "activations",
  "logits_and_loss",
  "temporaries",
  "cuda_overhead"
 ],
 "phases": [
  "block_forward",
  "forward_end",
  "backward_start",
  "head_backward",
  "block_backward",
  "backward_end",
  "embedding_backward",
  "optimizer_step"
 ],
 "category_zh": {
  "parameters": "模型参数",
  "gradients": "梯度",
  "optimizer_state": "优化器状态",
  "activations": "激活值",
  "logits_and_loss": "logits 与损失",
  "temporaries": "临时张量",
  "cuda_overhead": "CUDA 开销（cuBLAS 工作区）"
 },
 "phase_zh": {
  "block_forward": "最后一层前向",
  "forward_end": "前向末尾",
  "backward_start": "反向开始",
  "head_backward": "输出层反向",
  "block_backward": "最后一层反向",
  "backward_end": "反向末尾",
  "embedding_backward": "词嵌入反向",
  "optimizer_step": "优化器 step",
  "prefill": "前向（prefill）"
 },
 "dtype_bytes": {
  "fp32": 4,
  "bf16": 2,
  "fp16": 2
 },
 "cublas_workspace_bytes": 33554432,
 "lora_targets": {
  "gpt2": [
   "qkv"
  ],
  "bert": [
   "q",
   "v"
  ],
  "llama": [
   "q",
   "v"
  ],
  "mixtral": [
   "q",
   "v"
  ]
 },
 "bnb_blocksize": 256,
 "bnb_min_8bit_size": 4096,
 "cards_gb": [
  24,
  40,
  80,
  141
 ],
 "context_reserve_bytes": 734003200,
 "plan": {
  "hardware": {
   "name": "RTX 4090 级 24 GB 显卡（默认常数）",
   "bf16_tflops": 165.2,
   "fp32_tflops": 82.6,
   "hbm_gbps": 1008.0,
   "pcie_gbps": 31.5,
   "link_gbps": 31.5
  },
  "context_bytes": 734003200,
  "allocator_overhead": 1.0815448370588165,
  "pareto_step": 0.02,
  "nf4_bytes": 0.515869140625,
  "precisions": [
   "bf16-mixed",
   "bf16",
   "fp32"
  ],
  "precisions_no_bf16": [
   "fp16-mixed",
   "fp16",
   "fp32"
  ],
  "methods": [
   "full",
   "lora",
   "qlora"
  ],
  "eight_bit_min_share": 0.05,
  "moe_qlora_reason": "专家权重是 3 维参数而不是 nn.Linear：bitsandbytes 不会把它们量化成 4 位，prepare_model_for_kbit_training 还会把它们升为 FP32，所以 vramlab 不估算也不推荐 MoE 的 QLoRA",
  "targets_zh": {
   "default": "peft 默认目标",
   "qkvo": "注意力的 q/k/v/o 投影",
   "all-linear": "全部线性层（输出层除外）"
  },
  "default_target_names": {
   "gpt2": "c_attn",
   "bert": "query、value",
   "llama": "q_proj、v_proj",
   "mixtral": "q_proj、v_proj"
  },
  "cards": {
   "T4": {
    "name": "T4",
    "label": "NVIDIA T4 16 GB",
    "memory_gib": 16,
    "bf16": false,
    "tflops16": 65.0,
    "tflops32": 8.1,
    "hbm_gbps": 320,
    "pcie": 3,
    "source": "NVIDIA T4 Tensor Core GPU 数据手册：FP16 混合精度 65 TFLOPS、FP32 8.1 TFLOPS、GDDR6 320 GB/s；Turing 没有 BF16"
   },
   "V100-16GB": {
    "name": "V100-16GB",
    "label": "NVIDIA V100 SXM2 16 GB",
    "memory_gib": 16,
    "bf16": false,
    "tflops16": 125.0,
    "tflops32": 15.7,
    "hbm_gbps": 900,
    "pcie": 3,
    "source": "NVIDIA Tesla V100 数据手册（SXM2）：Tensor 125 TFLOPS、FP32 15.7 TFLOPS、HBM2 900 GB/s；Volta 没有 BF16"
   },
   "V100-32GB": {
    "name": "V100-32GB",
    "label": "NVIDIA V100 SXM2 32 GB",
    "memory_gib": 32,
    "bf16": false,
    "tflops16": 125.0,
    "tflops32": 15.7,
    "hbm_gbps": 900,
    "pcie": 3,
    "source": "NVIDIA Tesla V100 数据手册（SXM2）：Tensor 125 TFLOPS、FP32 15.7 TFLOPS、HBM2 900 GB/s；Volta 没有 BF16"
   },
   "A10": {
    "name": "A10",
    "label": "NVIDIA A10 24 GB",
    "memory_gib": 24,
    "bf16": true,
    "tflops16": 125.0,
    "tflops32": 31.2,
    "hbm_gbps": 600,
    "pcie": 4,
    "source": "NVIDIA A10 数据手册：BF16 Tensor 125 TFLOPS（稀疏 250）、FP32 31.2 TFLOPS、GDDR6 600 GB/s"
   },
   "RTX3090": {
    "name": "RTX3090",
    "label": "GeForce RTX 3090 24 GB",
    "memory_gib": 24,
    "bf16": true,
    "tflops16": 71.0,
    "tflops32": 35.6,
    "hbm_gbps": 936,
    "pcie": 4,
    "source": "NVIDIA Ampere GA102 白皮书附录 A：BF16 Tensor（FP32 累加）71 TFLOPS、FP32 35.6 TFLOPS、936 GB/s"
   },
   "RTX4090": {
    "name": "RTX4090",
    "label": "GeForce RTX 4090 24 GB",
    "memory_gib": 24,
    "bf16": true,
    "tflops16": 165.2,
    "tflops32": 82.6,
    "hbm_gbps": 1008,
    "pcie": 4,
    "source": "NVIDIA Ada GPU 架构白皮书附录 A：BF16 Tensor（FP32 累加）165.2 TFLOPS、FP32 82.6 TFLOPS、1008 GB/s"
   },
   "L4": {
    "name": "L4",
    "label": "NVIDIA L4 24 GB",
    "memory_gib": 24,
    "bf16": true,
    "tflops16": 121.0,
    "tflops32": 30.3,
    "hbm_gbps": 300,
    "pcie": 4,
    "source": "NVIDIA L4 数据手册：BF16 Tensor 121 TFLOPS（稀疏 242）、FP32 30.3 TFLOPS、GDDR6 300 GB/s"
   },
   "A100-40GB": {
    "name": "A100-40GB",
    "label": "NVIDIA A100 SXM 40 GB",
    "memory_gib": 40,
    "bf16": true,
    "tflops16": 312.0,
    "tflops32": 19.5,
    "hbm_gbps": 1555,
    "pcie": 4,
    "source": "NVIDIA A100 数据手册：BF16 Tensor 312 TFLOPS、FP32 19.5 TFLOPS、HBM2 1555 GB/s"
   },
   "A100-80GB": {
    "name": "A100-80GB",
    "label": "NVIDIA A100 SXM 80 GB",
    "memory_gib": 80,
    "bf16": true,
    "tflops16": 312.0,
    "tflops32": 19.5,
    "hbm_gbps": 2039,
    "pcie": 4,
    "source": "NVIDIA A100 数据手册：BF16 Tensor 312 TFLOPS、FP32 19.5 TFLOPS、HBM2e 2039 GB/s"
   },
   "H100": {
    "name": "H100",
    "label": "NVIDIA H100 SXM 80 GB",
    "memory_gib": 80,
    "bf16": true,
    "tflops16": 989.4,
    "tflops32": 66.9,
    "hbm_gbps": 3350,
    "pcie": 5,
    "source": "NVIDIA H100 数据手册（SXM）：BF16 Tensor 989 TFLOPS（稀疏 1979）、FP32 67 TFLOPS、HBM3 3.35 TB/s"
   },
   "H200": {
    "name": "H200",
    "label": "NVIDIA H200 SXM 141 GB",
    "memory_gib": 140,
    "bf16": true,
    "tflops16": 989.4,
    "tflops32": 66.9,
    "hbm_gbps": 4800,
    "pcie": 5,
    "source": "NVIDIA H200 数据手册（SXM）：BF16 Tensor 989 TFLOPS（稀疏 1979）、FP32 67 TFLOPS、HBM3e 4.8 TB/s；标称 141 GB，本项目 H200 参考表实测总量 143,771 MiB（约 140.4 GiB），按 140 GiB 计"
   }
  },
  "card_aliases": {
   "V100": "V100-16GB",
   "A100": "A100-40GB",
   "3090": "RTX3090",
   "4090": "RTX4090",
   "H100-80GB": "H100",
   "H200-141GB": "H200"
  },
  "pcie": {
   "3": 15.75,
   "4": 31.5,
   "5": 63.0
  },
  "method_zh": {
   "full": "全参数微调",
   "lora": "LoRA",
   "qlora": "QLoRA"
  },
  "precision_zh": {
   "fp32": "FP32",
   "bf16-mixed": "BF16 混合精度（FP32 权重 + autocast）",
   "bf16": "纯 BF16 权重",
   "fp16-mixed": "FP16 混合精度（FP32 权重 + autocast + 损失缩放）",
   "fp16": "纯 FP16 权重（冻结的基座）"
  },
  "optimizer_zh": {
   "adamw": "AdamW",
   "adamw8bit": "8-bit AdamW",
   "adafactor": "Adafactor（分解的二阶矩）"
  },
  "ckpt_zh": {
   "none": "不检查点",
   "selective": "选择性重算（注意力模块）",
   "full": "全量激活检查点"
  },
  "families": {
   "llama": "llama",
   "mistral": "llama",
   "qwen2": "llama",
   "mixtral": "mixtral",
   "gpt2": "gpt2",
   "bert": "bert"
  },
  "architectures": {
   "LlamaForCausalLM": "llama",
   "MistralForCausalLM": "mistral",
   "Qwen2ForCausalLM": "qwen2",
   "MixtralForCausalLM": "mixtral",
   "GPT2LMHeadModel": "gpt2",
   "BertForMaskedLM": "bert",
   "BertModel": "bert",
   "BertForPreTraining": "bert"
  },
  "required": {
   "llama": [
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "intermediate_size",
    "vocab_size"
   ],
   "mixtral": [
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "intermediate_size",
    "vocab_size",
    "num_local_experts",
    "num_experts_per_tok"
   ],
   "gpt2": [
    "n_embd",
    "n_layer",
    "n_head",
    "vocab_size"
   ],
   "bert": [
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "intermediate_size",
    "vocab_size"
   ]
  },
  "family_zh": {
   "llama": "Llama 式解码器（llama / mistral / qwen2）",
   "mixtral": "Mixtral 式 MoE 解码器",
   "gpt2": "GPT-2",
   "bert": "BERT"
  },
  "supported_zh": "llama、mistral、qwen2（Llama 式解码器）、mixtral（MoE）、gpt2、bert",
  "max_pos_default": {
   "llama": 2048,
   "mistral": 131072,
   "qwen2": 32768,
   "mixtral": 131072,
   "bert": 512
  },
  "samples": {
   "bert-base-uncased": {
    "architectures": [
     "BertForMaskedLM"
    ],
    "attention_probs_dropout_prob": 0.1,
    "gradient_checkpointing": false,
    "hidden_act": "gelu",
    "hidden_dropout_prob": 0.1,
    "hidden_size": 768,
    "initializer_range": 0.02,
    "intermediate_size": 3072,
    "layer_norm_eps": 1e-12,
    "max_position_embeddings": 512,
    "model_type": "bert",
    "num_attention_heads": 12,
    "num_hidden_layers": 12,
    "pad_token_id": 0,
    "position_embedding_type": "absolute",
    "transformers_version": "4.6.0.dev0",
    "type_vocab_size": 2,
    "use_cache": true,
    "vocab_size": 30522
   },
   "gpt2-medium": {
    "activation_function": "gelu_new",
    "architectures": [
     "GPT2LMHeadModel"
    ],
    "attn_pdrop": 0.1,
    "bos_token_id": 50256,
    "embd_pdrop": 0.1,
    "eos_token_id": 50256,
    "initializer_range": 0.02,
    "layer_norm_epsilon": 1e-05,
    "model_type": "gpt2",
    "n_ctx": 1024,
    "n_embd": 1024,
    "n_head": 16,
    "n_layer": 24,
    "n_positions": 1024,
    "n_special": 0,
    "predict_special_tokens": true,
    "resid_pdrop": 0.1,
    "summary_activation": null,
    "summary_first_dropout": 0.1,
    "summary_proj_to_labels": true,
    "summary_type": "cls_index",
    "summary_use_proj": true,
    "task_specific_params": {
     "text-generation": {
      "do_sample": true,
      "max_length": 50
     }
    },
    "vocab_size": 50257
   },
   "llama-3.1-8b": {
    "architectures": [
     "LlamaForCausalLM"
    ],
    "attention_bias": false,
    "attention_dropout": 0.0,
    "bos_token_id": 128000,
    "eos_token_id": 128001,
    "hidden_act": "silu",
    "hidden_size": 4096,
    "initializer_range": 0.02,
    "intermediate_size": 14336,
    "max_position_embeddings": 131072,
    "mlp_bias": false,
    "model_type": "llama",
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "pretraining_tp": 1,
    "rms_norm_eps": 1e-05,
    "rope_scaling": {
     "factor": 8.0,
     "low_freq_factor": 1.0,
     "high_freq_factor": 4.0,
     "original_max_position_embeddings": 8192,
     "rope_type": "llama3"
    },
    "rope_theta": 500000.0,
    "tie_word_embeddings": false,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.43.0.dev0",
    "use_cache": true,
    "vocab_size": 128256
   },
   "mistral-7b-v0.1": {
    "architectures": [
     "MistralForCausalLM"
    ],
    "bos_token_id": 1,
    "eos_token_id": 2,
    "hidden_act": "silu",
    "hidden_size": 4096,
    "initializer_range": 0.02,
    "intermediate_size": 14336,
    "max_position_embeddings": 32768,
    "model_type": "mistral",
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "rms_norm_eps": 1e-05,
    "rope_theta": 10000.0,
    "sliding_window": 4096,
    "tie_word_embeddings": false,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.34.0.dev0",
    "use_cache": true,
    "vocab_size": 32000
   },
   "mixtral-8x7b-v0.1": {
    "architectures": [
     "MixtralForCausalLM"
    ],
    "attention_dropout": 0.0,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "hidden_act": "silu",
    "hidden_size": 4096,
    "initializer_range": 0.02,
    "intermediate_size": 14336,
    "max_position_embeddings": 32768,
    "model_type": "mixtral",
    "num_attention_heads": 32,
    "num_experts_per_tok": 2,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "num_local_experts": 8,
    "output_router_logits": false,
    "rms_norm_eps": 1e-05,
    "rope_theta": 1000000.0,
    "router_aux_loss_coef": 0.02,
    "sliding_window": null,
    "tie_word_embeddings": false,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.36.0.dev0",
    "use_cache": true,
    "vocab_size": 32000
   },
   "qwen2.5-7b": {
    "architectures": [
     "Qwen2ForCausalLM"
    ],
    "attention_dropout": 0.0,
    "bos_token_id": 151643,
    "eos_token_id": 151643,
    "hidden_act": "silu",
    "hidden_size": 3584,
    "initializer_range": 0.02,
    "intermediate_size": 18944,
    "max_position_embeddings": 131072,
    "max_window_layers": 28,
    "model_type": "qwen2",
    "num_attention_heads": 28,
    "num_hidden_layers": 28,
    "num_key_value_heads": 4,
    "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0,
    "sliding_window": 131072,
    "tie_word_embeddings": false,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.40.1",
    "use_cache": true,
    "use_mrope": false,
    "use_sliding_window": false,
    "vocab_size": 152064
   }
  }
 }
};
