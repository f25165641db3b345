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
  "forward_end",
  "backward_start",
  "backward_end",
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
  "forward_end": "前向末尾",
  "backward_start": "反向开始",
  "backward_end": "反向末尾",
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
 "cards_gb": [
  24,
  40,
  80,
  141
 ],
 "context_reserve_bytes": 734003200
};
