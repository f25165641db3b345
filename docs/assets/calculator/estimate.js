/* 显存估算公式：vramlab/estimate.py 的逐行移植（JavaScript，无依赖）。
 *
 * 每个函数对应 estimate.py 里同名的 Python 函数，算式和求值顺序都保持一致，
 * 这样两边得到的字节数完全相同（tests/test_tools_browser.py 在浏览器里逐例核对）。
 * 改了 estimate.py 就要同步改这里；模型形状与常量来自 presets.js（python -m vramlab.webdata 生成）。
 * 数值都在 2^53 以内，JS 的 number 能精确表示整数；Python 的 a // b 写成 Math.floor(a / b)。
 */
(function (global) {
  "use strict";
  var D = global.VRAMLAB_CALC;

  function floorDiv(a, b) { return Math.floor(a / b); }
  function sum(xs) { var s = 0; for (var i = 0; i < xs.length; i++) s += xs[i]; return s; }
  function sumSaved(list) { var s = 0; for (var i = 0; i < list.length; i++) s += list[i][1]; return s; }
  function isLlama(p) { return p.family === "llama" || p.family === "mixtral"; }

  function WorkloadError(msg) { this.message = msg; this.name = "WorkloadError"; }
  WorkloadError.prototype = Object.create(Error.prototype);

  var DEFAULTS = { model: "gpt2-small", batch: 8, seq: 512, optimizer: "adamw", precision: "fp32",
    checkpointing: "none", attention: "sdpa", dropout: 0.0, lora_rank: 0, zero: 0, gpus: 1, accum: 1,
    offload: "none", foreach: true, inference: false };

  function workload(fields) {
    var w = {};
    for (var k in DEFAULTS) w[k] = (fields && fields[k] !== undefined) ? fields[k] : DEFAULTS[k];
    w.mixed = /-mixed$/.test(w.precision);
    w.param_dtype_name = (w.precision === "bf16" || w.precision === "fp16") ? w.precision : "fp32";
    w.compute_dtype_name = w.precision.split("-")[0];
    return w;
  }

  // workload.py Workload.validate()
  function validate(w) {
    var p = D.presets[w.model];
    if (!p) throw new WorkloadError("未知模型预设 " + w.model);
    var checks = [["optimizer", w.optimizer], ["precision", w.precision], ["checkpointing", w.checkpointing],
      ["attention", w.attention], ["offload", w.offload]];
    checks.forEach(function (c) {
      if (D.choices[c[0]].indexOf(c[1]) < 0)
        throw new WorkloadError("--" + c[0] + " 不支持 " + c[1] + "；可选：" + D.choices[c[0]].join(", "));
    });
    ["batch", "seq", "accum", "gpus"].forEach(function (k) {
      if (!(Number.isInteger(w[k]) && w[k] >= 1)) throw new WorkloadError("--" + k + " 必须是正整数，收到 " + w[k]);
    });
    if (!(w.dropout >= 0 && w.dropout < 1)) throw new WorkloadError("--dropout 必须在 [0, 1) 之间，收到 " + w.dropout);
    if (!(Number.isInteger(w.lora_rank) && w.lora_rank >= 0)) throw new WorkloadError("--lora-rank 不能为负，收到 " + w.lora_rank);
    if ([0, 1, 2, 3].indexOf(w.zero) < 0) throw new WorkloadError("--zero 只能是 0/1/2/3，收到 " + w.zero);
    if (w.zero && w.gpus < 2) throw new WorkloadError("ZeRO 需要多张卡分片：请同时给出 --gpus N（N ≥ 2）");
    if (w.seq > p.positions)
      throw new WorkloadError("模型 " + w.model + " 最多支持 " + p.positions + " 个位置，--seq " + w.seq + " 太长");
    if (w.seq * w.batch > Math.pow(2, 31)) throw new WorkloadError("batch × seq 太大：超过 2^31 个 token");
    return w;
  }

  // ---------------------------------------------------------------- parameters
  function linearShapes(p) {
    var h = p.hidden, f = p.ffn_hidden, hd = p.head_dim, q = p.heads * hd, kv = p.kv_heads * hd;
    if (p.family === "gpt2")
      return { qkv: [h, 3 * h, true], o: [h, h, true], up: [h, f, true], down: [f, h, true] };
    if (p.family === "bert")
      return { q: [h, h, true], k: [h, h, true], v: [h, h, true], o: [h, h, true], up: [h, f, true], down: [f, h, true] };
    var s = { q: [h, q, false], k: [h, kv, false], v: [h, kv, false], o: [q, h, false] };
    if (p.family === "llama") { s.gate = [h, f, false]; s.up = [h, f, false]; s.down = [f, h, false]; }
    else s.router = [h, p.num_local_experts, false];
    return s;
  }
  function shapeList(p) { var s = linearShapes(p); return Object.keys(s).map(function (k) { return s[k]; }); }

  function blockParams(p) {
    var n = sum(shapeList(p).map(function (x) { return x[0] * x[1] + (x[2] ? x[1] : 0); }));
    var h = p.hidden, f = p.ffn_hidden;
    if (p.family === "mixtral") n += p.num_local_experts * 3 * h * f;
    var norms = isLlama(p) ? 2 * h : 2 * 2 * h;
    return n + norms;
  }

  function paramCount(p) {
    var h = p.hidden, V = p.vocab;
    var n = p.n_layers * blockParams(p) + V * h;
    if (p.family === "gpt2") n += p.positions * h + 2 * h;
    else if (p.family === "bert") { n += (p.positions + 2) * h + 2 * h; n += h * h + h + 2 * h + V; }
    else n += h + (p.tie_word_embeddings ? 0 : V * h);
    return n;
  }

  function matmulWeightParams(p) {
    var perBlock = sum(shapeList(p).map(function (x) { return x[0] * x[1]; }));
    if (p.family === "mixtral") perBlock += p.num_local_experts * 3 * p.hidden * p.ffn_hidden;
    var head = p.vocab * p.hidden + (p.family === "bert" ? p.hidden * p.hidden : 0);
    return p.n_layers * perBlock + head;
  }

  function loraParams(p, rank) {
    var s = linearShapes(p);
    return p.n_layers * sum(D.lora_targets[p.family].map(function (t) { return rank * (s[t][0] + s[t][1]); }));
  }

  function qloraWeightBytes(n) { return n * (0.5 + 1 / 64 + 4 / (64 * 256)); }

  // ---------------------------------------------------------------- model states
  function optimizerStateBytes(opt, n, stateBytes, factored) {
    if (opt === "sgd") return 0;
    if (opt === "sgdm") return n * stateBytes;
    if (opt === "adamw") return 2 * n * stateBytes;
    if (opt === "adamw8bit") return Math.trunc(n * (2 + 2 * 4 / 2048));
    if (opt === "adafactor") {
      if (factored === undefined || factored === null) factored = 2 * Math.floor(Math.sqrt(n));
      return factored * stateBytes;
    }
    throw new WorkloadError("未知优化器 " + opt);
  }

  function adafactorFactoredElements(p, loraRank) {
    var h = p.hidden, s = linearShapes(p);
    if (loraRank)
      return p.n_layers * sum(D.lora_targets[p.family].map(function (t) { return 2 * loraRank + s[t][0] + s[t][1]; }));
    var rowsCols = sum(shapeList(p).map(function (x) { return x[0] + x[1] + (x[2] ? x[1] : 0); }));
    if (p.family === "mixtral") rowsCols += p.num_local_experts * 3 * (h + p.ffn_hidden);
    var perBlock = rowsCols + (isLlama(p) ? 2 * h : 4 * h);
    var emb = p.vocab + h + ((p.family === "gpt2" || p.family === "bert") ? p.positions + h : 0);
    return p.n_layers * perBlock + emb + 2 * h;
  }

  function bytesOf(w) {   // _Bytes: param, act, res, f32op, lora_in
    if (w.precision === "fp32") return { param: 4, act: 4, res: 4, f32op: 4, lora_in: 4 };
    if (w.mixed) return { param: 4, act: 2, res: 4, f32op: 4, lora_in: 2 };
    return { param: 2, act: 2, res: 2, f32op: 2, lora_in: 4 };
  }

  // ---------------------------------------------------------------- activations
  function savedAttention(w, p, d, n, oTrainable) {
    var hd = p.head_dim, b = w.batch, s = w.seq, q = p.heads * hd, kv = p.kv_heads * hd;
    var qkv = (q + 2 * kv) * n * d.act;
    if (w.attention === "sdpa")
      return [["q,k,v", qkv], ["attn_out", n * q * d.act], ["logsumexp", b * p.heads * Math.ceil(s / 32) * 32 * 4]];
    var out = [["q,k,v (matmul copies)", isLlama(p) ? (q + 2 * q) * n * d.act : qkv]];
    if (w.checkpointing !== "selective") {
      var scores = b * p.heads * s * s;
      out.push(["softmax(scores)", scores * d.f32op]);
      if (w.mixed) out.push(["softmax 16-bit copy", scores * d.act]);
      if (w.dropout > 0) { out.push(["attn dropout mask", scores]); out.push(["attn dropout out", scores * d.act]); }
    }
    if (oTrainable) out.push(["attn_out (contiguous)", n * q * d.act]);
    return out;
  }

  function savedPerBlock(w, p, first) {
    var d = bytesOf(w), n = w.batch * w.seq, h = p.hidden, f = p.ffn_hidden;
    var lora = w.lora_rank > 0, train = !lora, drop = w.dropout > 0, stats = 2 * n * 4;
    var saved = [];
    if (!(lora && first)) { saved.push(["norm1 input", n * h * d.res]); saved.push(["norm1 stats", stats]); }
    if (p.family === "bert") return savedBertBlock(w, p, d, n, train, drop, saved);
    if (isLlama(p)) return savedLlamaBlock(w, p, d, n, train, saved);
    if (train) saved.push(["c_attn input", n * h * d.act]);
    else saved.push(["lora_A input", n * h * d.lora_in]);
    saved = saved.concat(savedAttention(w, p, d, n, train));
    if (drop) saved.push(["resid dropout mask", n * h]);
    saved.push(["norm2 input", n * h * d.res]); saved.push(["norm2 stats", stats]);
    if (train) saved.push(["c_fc input", n * h * d.act]);
    // fused_gelu=False in estimate(): HF's gelu_new saves 4 tensors
    saved.push(["gelu: x for x³", n * f * d.f32op]); saved.push(["gelu: tanh", n * f * d.f32op]);
    saved.push(["gelu: 1+tanh", n * f * d.f32op]); saved.push(["gelu: 0.5·x", n * f * d.act]);
    if (train) saved.push(["mlp c_proj input", n * f * d.act]);
    if (drop) saved.push(["mlp dropout mask", n * h]);
    return saved;
  }

  function savedBertBlock(w, p, d, n, train, drop, saved) {
    var h = p.hidden, f = p.ffn_hidden;
    saved = saved.filter(function (x) { return x[0] !== "norm1 input"; });
    if (train) saved.push(["q/k/v input", n * h * (w.mixed ? 3 * d.act : d.res)]);
    else {   // frozen q/k/v keep only weights; one copy of x per adapted layer unless x is fp32 already
      var copies = w.precision === "fp32" ? 1 : D.lora_targets.bert.length;
      saved.push(["lora_A inputs", copies * n * h * d.lora_in]);
    }
    saved = saved.concat(savedAttention(w, p, d, n, train));
    if (drop) saved.push(["attn out dropout mask", n * h]);
    saved.push(["norm1 input", n * h * d.res]);
    if (train) saved.push(["ffn input", n * h * d.act]);
    saved.push(["gelu input", n * f * d.act]);
    if (train) saved.push(["ffn out-proj input", n * f * d.act]);
    if (drop) saved.push(["ffn dropout mask", n * h]);
    return saved.concat([["norm2 input", n * h * d.res], ["norm2 stats", 2 * n * 4]]);
  }

  function savedLlamaBlock(w, p, d, n, train, saved) {
    var h = p.hidden, f = p.ffn_hidden;
    var norm = [["rmsnorm x.float()", n * h * 4], ["rmsnorm normalised", n * h * d.res]];
    saved = saved.filter(function (x) { return x[0] !== "norm1 input"; }).concat(norm);
    saved.push(["q/k/v input", train ? n * h * d.act : n * h * d.lora_in]);
    saved = saved.concat(savedAttention(w, p, d, n, train));
    saved = saved.concat(norm.map(function (x) { return [x[0].replace("1", "2"), x[1]]; }));
    saved.push(["norm2 stats", 2 * n * 4]);
    if (train) saved.push(["mlp input", n * h * d.act]);
    if (p.family === "mixtral") {
      var k = p.num_experts_per_tok, e = p.num_local_experts;
      saved.push(["router logits", n * e * (d.act + 4)]);
      saved.push(["expert inputs", k * n * h * d.act]); saved.push(["expert outputs", k * n * h * d.act]);
      n = n * k;
    }
    saved.push(["gate", n * f * d.act]); saved.push(["silu(gate)", n * f * d.act]); saved.push(["up", n * f * d.act]);
    if (train) saved.push(["down input", n * f * d.act]);
    return saved;
  }

  function savedHead(w, p, d) {
    var n = w.batch * w.seq, h = p.hidden;
    var total = n * h * d.res + 2 * n * 4;
    if (w.lora_rank === 0) total += n * h * d.act;
    if (w.dropout > 0 && (p.family === "gpt2" || p.family === "bert")) total += n * h;
    if (p.family === "bert") total += n * h * (2 * d.act + d.res);
    return total;
  }

  function activationBytes(w, p) {
    if (w.offload === "activations") return 0;
    var d = bytesOf(w), blocks;
    if (w.checkpointing === "full") blocks = p.n_layers * w.batch * w.seq * p.hidden * d.res;
    else blocks = sumSaved(savedPerBlock(w, p, true)) + (p.n_layers - 1) * sumSaved(savedPerBlock(w, p, false));
    return blocks + savedHead(w, p, d);
  }

  function logitsBytes(w, p) {
    var d = bytesOf(w), nv = w.batch * w.seq * p.vocab;
    var lossB = (p.family === "bert" && w.param_dtype_name !== "fp32") ? 2 : 4;
    var labels = 8 * w.batch * w.seq;
    return { forward_end: nv * (d.act + (d.act !== lossB ? lossB : 0) + lossB) + labels,
             backward_start: 3 * nv * lossB + labels };
  }

  // ---------------------------------------------------------------- the estimate
  function optimizerTempBytes(w, p, trainable, sBytes, lora) {
    if (w.optimizer === "sgd" || w.optimizer === "sgdm" || w.optimizer === "adamw8bit") return 0;
    if (w.optimizer === "adamw" && w.foreach) return trainable * sBytes;
    var largest = Math.max(p.vocab * p.hidden, Math.max.apply(null, shapeList(p).map(function (x) { return x[0] * x[1]; })));
    return (lora ? trainable : largest) * sBytes;
  }

  function finish(w, phases, params, trainable, order) {
    var totals = {}, peak = null;
    order.forEach(function (ph) {
      totals[ph] = sum(D.keys.map(function (k) { return phases[ph][k]; }));
      if (peak === null || totals[ph] > totals[peak]) peak = ph;   // max(): first of equal totals
    });
    var breakdown = {};
    D.keys.forEach(function (k) { breakdown[k] = Math.trunc(phases[peak][k]); });
    var totalsInt = {};
    order.forEach(function (ph) { totalsInt[ph] = Math.trunc(totals[ph]); });
    return { workload: w, total_bytes: Math.trunc(totals[peak]), breakdown: breakdown, params: params,
             trainable_params: trainable, peak_phase: peak, phases: totalsInt };
  }

  function estimate(fields, qlora) {
    var w = validate(workload(fields));
    if (qlora && w.lora_rank === 0) throw new WorkloadError("QLoRA 需要 LoRA：请同时给出 --lora-rank r（r > 0）");
    var p = D.presets[w.model];
    if (w.inference) return estimateInference(w, p);
    var d = bytesOf(w), params = paramCount(p), lora = w.lora_rank > 0;
    var trainable = lora ? loraParams(p, w.lora_rank) : params;
    var nDev = w.zero ? w.gpus : 1;

    var mm = matmulWeightParams(p), baseW;
    baseW = qlora ? qloraWeightBytes(mm) + (params - mm) * d.param : params * d.param;
    var weights, wBytes, gBytes, sBytes;
    if (lora) { weights = baseW + trainable * 4; wBytes = 4; gBytes = 4; sBytes = 4; }
    else if (w.zero && w.mixed) { weights = params * 2; wBytes = 2; gBytes = 2; sBytes = 4; }
    else { weights = baseW; wBytes = d.param; gBytes = d.param; sBytes = d.param; }
    var grads = trainable * gBytes;
    var state = optimizerStateBytes(w.optimizer, trainable, sBytes, adafactorFactoredElements(p, w.lora_rank));
    if (w.zero && w.mixed && !lora) state += params * 4;
    if (w.zero >= 1) state = floorDiv(state, nDev);
    if (w.zero >= 2) grads = floorDiv(grads, nDev);
    if (w.zero >= 3) weights = floorDiv(weights, nDev);
    var autocastCache = (w.mixed && !w.zero && !qlora) ? mm * 2 : 0;

    var act = activationBytes(w, p), lg = logitsBytes(w, p), ckpt = w.checkpointing === "full";
    var savedCasts;
    if (w.offload === "activations") savedCasts = 0;
    else if (ckpt) savedCasts = autocastCache ? p.vocab * p.hidden * 2 : 0;
    else savedCasts = autocastCache;
    var block = sumSaved(savedPerBlock(w, p, false));
    var ws = 2 * D.cublas_workspace_bytes;
    var gradsNow = w.accum > 1 ? grads : 0;

    var tempOpt = floorDiv(optimizerTempBytes(w, p, trainable, sBytes, lora), w.zero ? nDev : 1);
    var gather = w.zero === 3 ? 2 * blockParams(p) * wBytes : 0;
    var dequant = qlora ? Math.max.apply(null, shapeList(p).map(function (x) { return x[0] * x[1]; })) * d.act : 0;

    var phases = {
      forward_end: { parameters: weights + autocastCache, gradients: gradsNow, optimizer_state: state,
        activations: act, logits_and_loss: lg.forward_end, temporaries: gather + dequant, cuda_overhead: ws },
      backward_start: { parameters: weights + savedCasts, gradients: gradsNow, optimizer_state: state,
        activations: act, logits_and_loss: lg.backward_start, temporaries: gather + dequant, cuda_overhead: ws },
      backward_end: { parameters: weights + floorDiv(autocastCache, Math.max(1, p.n_layers)), gradients: grads,
        optimizer_state: state, activations: (ckpt ? act : 0) + block, logits_and_loss: 0,
        temporaries: gather + dequant, cuda_overhead: ws },
      optimizer_step: { parameters: weights, gradients: grads, optimizer_state: state, activations: 0,
        logits_and_loss: 0, temporaries: tempOpt, cuda_overhead: ws }
    };
    return finish(w, phases, params, trainable, D.phases);
  }

  function estimateInference(w, p) {
    var dtype = w.compute_dtype_name, b = D.dtype_bytes[dtype], params = paramCount(p);
    var n = w.batch * w.seq, h = p.hidden, f = p.ffn_hidden;
    var weightB = (w.mixed || w.precision === "fp32") ? 4 : b;
    var cache = w.mixed ? matmulWeightParams(p) * 2 : 0;
    var widest = { gpt2: 4, bert: 2, llama: 3, mixtral: 3 }[p.family];
    var k = p.num_experts_per_tok || 1;
    var blockWs = n * (2 * h + widest * f * k) * b;
    if (w.attention === "eager") blockWs = Math.max(blockWs, n * 2 * h * b + 2 * w.batch * p.heads * w.seq * w.seq * b);
    var logits = n * p.vocab * b + n * h * b;     // estimate() calls it with kv_cache=False
    var inBlock = blockWs > logits;
    var row = { parameters: params * weightB + cache, gradients: 0, optimizer_state: 0, activations: 0,
      logits_and_loss: inBlock ? 0 : logits, temporaries: inBlock ? blockWs : 0,
      cuda_overhead: D.cublas_workspace_bytes };
    return finish(w, { prefill: row }, params, 0, ["prefill"]);
  }

  // ---------------------------------------------------------------- cards
  function fitVerdict(totalBytes, cardGb) {   // webdata.fit_verdict
    var cap = cardGb * 1e9;
    if (totalBytes + D.context_reserve_bytes <= cap) return "fits";
    return totalBytes <= cap ? "tight" : "no";
  }

  global.VramEstimate = { estimate: estimate, validate: validate, workload: workload, paramCount: paramCount,
    loraParams: loraParams, fitVerdict: fitVerdict, WorkloadError: WorkloadError,
    // for plan.js (vramlab.plan's cost model)
    matmulWeightParams: matmulWeightParams, linearShapes: linearShapes, activationBytes: activationBytes };
})(window);
