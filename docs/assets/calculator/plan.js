/* 微调规划器：`vramlab plan` 的搜索与步时模型在浏览器里的移植（vramlab/plan.py、vramlab/hfconfig.py）。
 *
 * 读一段 config.json（粘贴或选示例）→ 转成估算器的模型形状 → 枚举精度 / 方法 / 优化器 / 检查点 / 卸载 /
 * ZeRO / 微批次 的全部组合 → VramEstimate.estimate() 估算每一种 → 按步时排序，取每种方法的 Pareto 前沿。
 * 数字与命令行 `vramlab plan --no-verify` 相同（tests/test_plan_browser.py 逐项核对）；浏览器里不跑模拟设备，
 * 验证请用命令行。结果也写在 data-plan 属性上（JSON），方便测试读取。
 */
(function (global) {
  "use strict";
  var D = global.VRAMLAB_CALC, E = global.VramEstimate;
  if (!D || !E || !D.plan) return;
  var P = D.plan, MiB = 1024 * 1024, GiB = 1024 * MiB;

  function ConfigError(msg) { this.message = msg; this.name = "ConfigError"; }
  ConfigError.prototype = Object.create(Error.prototype);

  // ---------------------------------------------------------------- hfconfig.preset_from_config
  function isInt(v) { return typeof v === "number" && Number.isInteger(v); }
  function modelTypeOf(cfg) {
    if (typeof cfg.model_type === "string" && cfg.model_type) return cfg.model_type;
    var archs = cfg.architectures || [];
    for (var i = 0; i < archs.length; i++) if (P.architectures[archs[i]]) return P.architectures[archs[i]];
    return null;
  }

  function presetFromConfig(cfg, where) {
    if (cfg === null || typeof cfg !== "object" || Array.isArray(cfg))
      throw new ConfigError(where + " 的内容应是一个 JSON 对象（{...}）");
    var mt = modelTypeOf(cfg);
    if (mt === null)
      throw new ConfigError(where + " 没有 model_type，architectures 里也没有认识的结构：无法判断模型家族。vramlab 支持：" + P.supported_zh);
    if (!P.families[mt]) {
      var arch = (cfg.architectures || []).join("、") || "未给出";
      throw new ConfigError(where + "：不支持的模型结构 model_type='" + mt + "'（architectures：" + arch + "）。vramlab 能按形状建模的家族：" + P.supported_zh);
    }
    var family = P.families[mt], req = P.required[family];
    var missing = req.filter(function (k) { return cfg[k] === undefined || cfg[k] === null; });
    if (family === "gpt2" && cfg.n_positions == null && cfg.n_ctx == null) missing.push("n_positions");
    if (missing.length)
      throw new ConfigError(where + "：" + mt + " 模型（" + P.family_zh[family] + "）缺少字段 " + missing.join("、") + "；这一家族需要：" + req.join("、"));
    function int(key) {
      var v = cfg[key];
      if (typeof v === "boolean" || !isInt(v) || v < 1) throw new ConfigError(where + "：字段 " + key + " 应是 ≥ 1 的整数，收到 " + JSON.stringify(v));
      return v;
    }
    req.forEach(int);
    var bad = [];
    function refuse(key, value, need) { bad.push(key + "=" + JSON.stringify(value) + "（vramlab 只能建模 " + need + "）"); }
    var p = { family: family, fake_only: false, num_local_experts: 0, num_experts_per_tok: 1, tie_word_embeddings: false };
    var h, heads;
    if (family === "gpt2") {
      h = cfg.n_embd; heads = cfg.n_head;
      var act = cfg.activation_function === undefined ? "gelu_new" : cfg.activation_function;
      if (act !== "gelu_new") refuse("activation_function", act, "gelu_new");
      p.n_layers = cfg.n_layer; p.vocab = cfg.vocab_size;
      p.positions = int(cfg.n_positions != null ? "n_positions" : "n_ctx");
      p.ffn_hidden = cfg.n_inner != null ? int("n_inner") : 4 * h;
      p.kv_heads = heads; p.head_dim = Math.floor(h / heads);
    } else if (family === "bert") {
      h = cfg.hidden_size; heads = cfg.num_attention_heads;
      [["hidden_act", cfg.hidden_act === undefined ? "gelu" : cfg.hidden_act, "gelu"],
       ["type_vocab_size", cfg.type_vocab_size === undefined ? 2 : cfg.type_vocab_size, 2],
       ["position_embedding_type", cfg.position_embedding_type === undefined ? "absolute" : cfg.position_embedding_type, "absolute"]
      ].forEach(function (x) { if (x[1] !== x[2]) refuse(x[0], x[1], x[2]); });
      p.n_layers = cfg.num_hidden_layers; p.vocab = cfg.vocab_size; p.ffn_hidden = cfg.intermediate_size;
      p.positions = cfg.max_position_embeddings != null ? int("max_position_embeddings") : P.max_pos_default.bert;
      p.kv_heads = heads; p.head_dim = Math.floor(h / heads);
    } else {
      h = cfg.hidden_size; heads = cfg.num_attention_heads;
      var hact = cfg.hidden_act === undefined ? "silu" : cfg.hidden_act;
      if (hact !== "silu") refuse("hidden_act", hact, "silu（SwiGLU）");
      ["attention_bias", "mlp_bias"].forEach(function (k) { if (cfg[k]) refuse(k, cfg[k], "false（线性层不带偏置）"); });
      if (mt === "mixtral" && (cfg.num_experts_per_tok || 0) > (cfg.num_local_experts || 0))
        refuse("num_experts_per_tok", cfg.num_experts_per_tok, "≤ num_local_experts");
      var kv = cfg.num_key_value_heads != null ? int("num_key_value_heads") : heads;
      if (heads % kv) refuse("num_key_value_heads", kv, "num_attention_heads（" + heads + "）的约数");
      p.n_layers = cfg.num_hidden_layers; p.vocab = cfg.vocab_size; p.ffn_hidden = cfg.intermediate_size;
      p.positions = cfg.max_position_embeddings != null ? int("max_position_embeddings") : P.max_pos_default[mt];
      p.tie_word_embeddings = !!cfg.tie_word_embeddings;
      p.kv_heads = kv;
      p.head_dim = cfg.head_dim != null ? int("head_dim") : Math.floor(h / heads);
      if (mt === "mixtral") { p.num_local_experts = cfg.num_local_experts; p.num_experts_per_tok = cfg.num_experts_per_tok; }
    }
    if (h % heads && !(family !== "gpt2" && family !== "bert" && cfg.head_dim != null))
      refuse(family === "gpt2" ? "n_embd" : "hidden_size", h, "注意力头数（" + heads + "）的整数倍");
    if (bad.length) throw new ConfigError(where + "：" + mt + " 模型有 vramlab 不能建模的设置：" + bad.join("；"));
    p.hidden = h; p.heads = heads;
    p.params = E.paramCount(p);
    p.fake_only = p.params > 500000000;
    p.model_type = mt;
    return p;
  }

  // ---------------------------------------------------------------- plan.step_cost
  function sum(xs) { var s = 0; for (var i = 0; i < xs.length; i++) s += xs[i]; return s; }
  function activeMatmulParams(p) {
    var n = E.matmulWeightParams(p);
    if (p.family === "mixtral") n -= p.n_layers * (p.num_local_experts - p.num_experts_per_tok) * 3 * p.hidden * p.ffn_hidden;
    return n;
  }
  function attentionParams(p) {
    var s = E.linearShapes(p);
    return p.n_layers * sum(Object.keys(s).filter(function (k) { return ["qkv", "q", "k", "v", "o"].indexOf(k) >= 0; })
      .map(function (k) { return s[k][0] * s[k][1]; }));
  }
  var withFields = E.withChanges;
  function isPure16(w) { return w.precision === "bf16" || w.precision === "fp16"; }

  function stepCost(c, p, hw) {
    var w = c.w, tokens = w.batch * w.accum * w.seq, nmm = activeMatmulParams(p);
    var attn = 2 * p.n_layers * w.seq * p.heads * p.head_dim, fwd = 2 * nmm + attn;
    var lora = w.lora_rank > 0, adapters = lora ? E.loraParams(p, w.lora_rank, w.lora_targets) : 0;
    var train = lora ? (fwd + 2 * nmm + 2 * attn + 6 * adapters) : 3 * fwd;
    var recompute = w.checkpointing === "full" ? fwd : (w.checkpointing === "selective" ? 2 * attentionParams(p) + attn : 0);
    var rate = (w.precision === "fp32" ? hw.fp32_tflops : hw.bf16_tflops) * 1e12;
    var out = { compute: tokens * train / rate, recompute: tokens * recompute / rate };
    var act = w.offload === "activations" ? E.activationBytes(withFields(w, { offload: "none" }), p) : 0;
    out.offload = 2 * act * w.accum / (hw.pcie_gbps * 1e9);
    var passes = w.checkpointing === "full" ? 3 : 2;
    out.dequant = w.qlora ? passes * E.matmulWeightParams(p) * (P.nf4_bytes + 2) * w.accum / (hw.hbm_gbps * 1e9) : 0;
    var trainable = lora ? adapters : p.params;
    var wb = (isPure16(w) && !lora) ? 2 : 4;
    var state = { adamw: 2 * wb, adamw8bit: 2, adafactor: 0, sgd: 0, sgdm: wb }[w.optimizer];
    if (w.zero && w.mixed && !lora) state += 4;
    var shard = w.zero ? w.gpus : 1;
    out.optimizer = trainable * (3 * wb + 2 * state) / shard / (hw.hbm_gbps * 1e9);
    var comm = 0;
    if (w.gpus > 1) {
      var ring = (w.gpus - 1) / w.gpus;
      var gb = ((w.mixed || isPure16(w)) && !lora) ? 2 : 4, grads = trainable * gb;
      if (w.zero === 0 || w.zero === 1) comm = 2 * grads;
      else if (w.zero === 2) comm = grads * w.accum + trainable * gb;
      else comm = (2 * p.params * (w.precision !== "fp32" ? 2 : 4) + grads) * w.accum;
      comm *= ring;
    }
    out.communication = comm / (hw.link_gbps * 1e9);
    // the same order of additions as Python's sum(out.values())
    out.total = out.compute + out.recompute + out.offload + out.dequant + out.optimizer + out.communication;
    return out;
  }

  // ---------------------------------------------------------------- plan.search
  function microBatches(perGpu) {
    var out = [];
    for (var i = 0; i < 12; i++) { var b = Math.pow(2, i); if (b <= perGpu && perGpu % b === 0) out.push(b); }
    return out;
  }
  function precisionsFor(bf16, m) {
    if (m === "qlora") return bf16 ? ["bf16-mixed", "bf16"] : ["fp16-mixed", "fp16"];
    if (bf16) return P.precisions;
    return m === "full" ? ["fp16-mixed", "fp32"] : P.precisions_no_bf16;
  }
  function candidates(name, p, o) {
    var perGpu = o.global_batch / o.gpus, out = [], zeros = o.gpus === 1 ? [0] : [0, 1, 2, 3];
    o.methods.forEach(function (m) {
      if (m === "qlora" && p.family === "mixtral") return;
      var opts = m === "full" ? ["adamw", "adamw8bit", "adafactor"] : ["adamw", "adamw8bit"];
      precisionsFor(o.bf16, m).forEach(function (precision) { opts.forEach(function (optimizer) {
        ["none", "selective", "full"].forEach(function (ckpt) { ["none", "activations"].forEach(function (offload) {
          zeros.forEach(function (zero) { microBatches(perGpu).forEach(function (b) {
            out.push({ w: E.workload({ model: name, batch: b, seq: o.seq, optimizer: optimizer, precision: precision,
              checkpointing: ckpt, lora_rank: m === "full" ? 0 : o.lora_rank,
              lora_targets: m !== "full" ? o.lora_targets : "default", qlora: m === "qlora", zero: zero, gpus: o.gpus,
              accum: perGpu / b, offload: offload }) });
          }); });
        }); });
      }); });
    });
    return out;
  }
  function method(c) { return c.w.qlora ? "qlora" : (c.w.lora_rank ? "lora" : "full"); }
  function score(c, p, usable, hw) {
    var e = E.estimate(c.w), w = c.w, need = e.total_bytes;
    if (w.gpus > 1 && w.zero === 0)
      need += e.trainable_params * (w.lora_rank ? 4 : (isPure16(w) ? 2 : 4));
    need = Math.trunc(need * P.allocator_overhead);
    return { c: c, e: e, need: need, cost: stepCost(c, p, hw), fits: need <= usable };
  }
  var PREC_RANK = { "bf16-mixed": 0, "fp16-mixed": 0, "fp32": 1, "bf16": 2, "fp16": 2 },
    OPT_RANK = { adamw: 0, adamw8bit: 1, adafactor: 2 };
  function round6(x) { return Math.round(x * 1e6) / 1e6; }
  function cmpKey(a, b) {
    var ka = [round6(a.cost.total), -a.c.w.batch, PREC_RANK[a.c.w.precision], OPT_RANK[a.c.w.optimizer], a.need];
    var kb = [round6(b.cost.total), -b.c.w.batch, PREC_RANK[b.c.w.precision], OPT_RANK[b.c.w.optimizer], b.need];
    for (var i = 0; i < ka.length; i++) if (ka[i] !== kb[i]) return ka[i] < kb[i] ? -1 : 1;
    return 0;
  }
  function recipeKey(w) { return [w.qlora, w.lora_rank > 0, w.precision, w.optimizer, w.checkpointing, w.offload, w.zero].join("|"); }
  function stableSort(xs, cmp) {   // Python's sort is stable; so is this
    return xs.map(function (x, i) { return [x, i]; }).sort(function (a, b) { return cmp(a[0], b[0]) || a[1] - b[1]; })
      .map(function (x) { return x[0]; });
  }

  function search(name, p, o, usable, hw) {
    var scored = [], leftOut = [];
    if (o.methods.indexOf("qlora") >= 0 && p.family === "mixtral")
      leftOut.push({ workload: null, summary: "QLoRA（MoE 模型）", reason: P.moe_qlora_reason });
    candidates(name, p, o).forEach(function (c) {
      try { scored.push(score(c, p, usable, hw)); }
      catch (err) { if (!(err instanceof E.WorkloadError)) throw err; }
    });
    // 8-bit AdamW: only where it saves a meaningful share of the same recipe with AdamW
    var byKey = {};
    scored.forEach(function (s) { byKey[recipeKey(s.c.w) + "#" + s.c.w.batch] = s; });
    var kept = [], dropped = {}, droppedOrder = [];
    scored.forEach(function (s) {
      var w = s.c.w, base = null;
      if (w.optimizer === "adamw8bit") base = byKey[recipeKey(withFields(w, { optimizer: "adamw" })) + "#" + w.batch] || null;
      if (base !== null && base.e.total_bytes - s.e.total_bytes < P.eight_bit_min_share * base.e.total_bytes) {
        if (s.fits) {
          var k = recipeKey(w);
          if (!dropped[k]) { dropped[k] = []; droppedOrder.push(k); }
          dropped[k].push([s, base]);
        }
        return;
      }
      kept.push(s);
    });
    scored = kept;
    var keptRecipes = {};
    scored.forEach(function (s) { if (s.fits) keptRecipes[recipeKey(s.c.w)] = true; });
    var perMethod = {}, methodOrder = [];
    droppedOrder.forEach(function (k) {
      if (keptRecipes[k]) return;
      var best = null;
      dropped[k].forEach(function (sb) {
        var r = sb[0].e.total_bytes / Math.max(1, sb[1].e.total_bytes);
        if (best === null || r > best[2]) best = [sb[0], sb[1], r];
      });
      var m = method(best[0].c);
      if (!perMethod[m]) { perMethod[m] = []; methodOrder.push(m); }
      perMethod[m].push([best[0], best[1]]);
    });
    methodOrder.forEach(function (m) {
      var pairs = perMethod[m], best = null;
      pairs.forEach(function (sb) { var r = 1 - sb[0].e.total_bytes / sb[1].e.total_bytes; if (best === null || r > best[2]) best = [sb[0], sb[1], r]; });
      var saved = Math.max(0, best[1].e.total_bytes - best[0].e.total_bytes);
      leftOut.push({ workload: wlDict(best[0].c.w), summary: P.method_zh[m] + " + 8-bit AdamW（" + pairs.length + " 个方案）",
        reason: "最多只比 AdamW 省 " + fmtBytes(saved) + "（峰值的 " + (100 * saved / best[1].e.total_bytes).toFixed(1) + "%），不到 " +
          Math.round(100 * P.eight_bit_min_share) + "%，不值得为它引入 bitsandbytes" });
    });
    var recipes = {}, recipeOrder = [];
    stableSort(scored.filter(function (s) { return s.fits; }), function (a, b) { return b.c.w.batch - a.c.w.batch; })
      .forEach(function (s) {
        var k = recipeKey(s.c.w);
        if (!recipes[k]) { recipes[k] = []; recipeOrder.push(k); }
        recipes[k].push(s);
      });
    var ordered = stableSort(recipeOrder.map(function (k) { return recipes[k]; }), function (a, b) { return cmpKey(a[0], b[0]); });
    var fronts = {}, order = [];
    ordered.forEach(function (r) {
      var m = method(r[0].c);
      if (!fronts[m]) { fronts[m] = []; order.push(m); }
      var f = fronts[m];
      if (!f.length || r[0].need < f[f.length - 1][0].need * (1 - P.pareto_step)) f.push(r);
      else {
        var better = f[f.length - 1][0];
        leftOut.push({ workload: wlDict(r[0].c.w), summary: summary(r[0].c, p),
          reason: "比“" + summary(better.c, p) + "”慢（" + fmtS(r[0].cost.total) + " 对 " + fmtS(better.cost.total) +
            "/步），显存也没有省下 " + Math.round(100 * P.pareto_step) + "% 以上" });
      }
    });
    var heads = stableSort(order.map(function (m) { return fronts[m][0]; }), function (a, b) { return cmpKey(a[0], b[0]); });
    var rest = [];
    order.forEach(function (m) { rest = rest.concat(fronts[m].slice(1)); });
    return { scored: scored, ranked: heads.concat(stableSort(rest, function (a, b) { return cmpKey(a[0], b[0]); })), leftOut: leftOut };
  }

  // ---------------------------------------------------------------- plan.make_plan (verify=False)
  function targetsZh(w, p) {
    if (w.lora_targets === "default" && p) return "目标 " + P.default_target_names[p.family] + "（peft 默认）";
    return "目标 " + P.targets_zh[w.lora_targets];
  }
  function precisionZh(w) {
    if (!w.qlora) return P.precision_zh[w.precision];
    var t = w.compute_dtype_name.toUpperCase();
    if (w.mixed) return t + " 计算 + autocast" + (t === "FP16" ? "（损失缩放）" : "");
    return t !== "FP32" ? t + " 计算（不开 autocast）" : "FP32 计算";
  }
  function summary(c, p) {
    var w = c.w, parts = [P.method_zh[method(c)] + (w.lora_rank ? " r=" + w.lora_rank + "（" + targetsZh(w, p) + "）" : ""),
      precisionZh(w), P.optimizer_zh[w.optimizer], P.ckpt_zh[w.checkpointing]];
    if (w.offload !== "none") parts.push("激活值卸载");
    if (w.gpus > 1) parts.push(w.gpus + " 卡" + (w.zero ? " ZeRO-" + w.zero : " 数据并行"));
    parts.push("微批次 " + w.batch + " × 累积 " + w.accum);
    return parts.join("，");
  }
  function toggles(s) {
    var w = s.c.w, out = [];
    if (w.qlora) out.push(["QLoRA（NF4 基座）", { w: withFields(w, { qlora: false }) }]);
    else if (w.lora_rank) out.push(["LoRA r=" + w.lora_rank, { w: withFields(w, { lora_rank: 0, lora_targets: "default" }) }]);
    if (w.precision !== "fp32") out.push([precisionZh(w), { w: withFields(w, { precision: "fp32" }) }]);
    if (w.optimizer !== "adamw") out.push([P.optimizer_zh[w.optimizer], { w: withFields(w, { optimizer: "adamw" }) }]);
    if (w.checkpointing !== "none") out.push([P.ckpt_zh[w.checkpointing], { w: withFields(w, { checkpointing: "none" }) }]);
    if (w.offload !== "none") out.push(["激活值卸载到主存（save_on_cpu）", { w: withFields(w, { offload: "none" }) }]);
    if (w.zero) out.push(["ZeRO-" + w.zero + "（" + w.gpus + " 卡分片）", { w: withFields(w, { zero: 0 }) }]);
    if (w.accum > 1) out.push(["梯度累积 " + w.accum + " 步", { w: withFields(w, { batch: w.batch * w.accum, accum: 1 }) }]);
    return out;
  }
  function wlDict(w) {
    var wl = {};
    ["model", "batch", "seq", "optimizer", "precision", "checkpointing", "attention", "dropout", "lora_rank", "zero",
      "gpus", "accum", "offload", "foreach", "inference", "lora_targets", "qlora"].forEach(function (f) { wl[f] = w[f]; });
    return wl;
  }
  function recommendation(s, p, usable, hw) {
    var c = s.c, w = c.w, techniques = [];
    toggles(s).forEach(function (t) {
      try {
        var o = score(t[1], p, usable, hw);
        techniques.push({ technique: t[0], without_need_bytes: o.need, without_fits: o.fits,
          saves_bytes: o.need - s.need, costs_seconds: s.cost.total - o.cost.total });
      } catch (err) { if (!(err instanceof E.WorkloadError)) throw err; }
    });
    var perGpu = w.batch * w.accum, nxt = null;
    if (2 * w.batch <= perGpu && perGpu % (2 * w.batch) === 0) {
      var big = score({ w: withFields(w, { batch: 2 * w.batch, accum: perGpu / (2 * w.batch) }) }, p, usable, hw);
      nxt = { batch: 2 * w.batch, accum: perGpu / (2 * w.batch), need_bytes: big.need, fits_estimate: big.fits };
    }
    var breakdown = {};
    for (var k in s.e.breakdown) breakdown[k] = s.e.breakdown[k];
    return { method: method(c), qlora: w.qlora, workload: wlDict(w), summary: summary(c, p),
      lora_targets: w.lora_rank ? targetsZh(w, p) : null,
      estimate_bytes: s.e.total_bytes, need_bytes: s.need, breakdown: breakdown, peak_phase: s.e.peak_phase,
      trainable_params: s.e.trainable_params, cost: s.cost, techniques: techniques, next_micro_batch: nxt,
      verified: { status: "skipped", reason: "浏览器里不运行模拟设备：用命令行 vramlab plan 在模拟设备上验证" } };
  }

  function findCard(text) {
    function key(s) { return String(s).replace(/[\s_\-]+/g, "").toUpperCase(); }
    var names = {};
    Object.keys(P.cards).forEach(function (n) { names[key(n)] = n; });
    Object.keys(P.card_aliases).forEach(function (a) { names[key(a)] = P.card_aliases[a]; });
    var n = names[key(text)];
    return n ? P.cards[n] : null;
  }
  function cardHardware(c) {
    return { name: c.label, bf16_tflops: c.tflops16, fp32_tflops: c.tflops32, hbm_gbps: c.hbm_gbps,
      pcie_gbps: P.pcie[c.pcie], link_gbps: P.pcie[c.pcie] };
  }

  function makePlan(p, name, opts) {
    var card = opts.card, cardInfo = (typeof card === "object") ? card : null;
    var o = { gpus: opts.gpus || 1, global_batch: opts.global_batch || 16, lora_rank: opts.lora_rank || 16,
      top: opts.top || 3, methods: opts.methods || P.methods, lora_targets: opts.lora_targets || "default" };
    o.card = cardInfo ? cardInfo.memory_gib * GiB : card;
    o.bf16 = cardInfo ? cardInfo.bf16 : true;
    o.seq = opts.seq || Math.min(2048, p.positions);
    if (o.seq > p.positions) throw new E.WorkloadError("模型最多支持 " + p.positions + " 个位置，--seq " + o.seq + " 太长");
    if (!(o.gpus >= 1 && o.global_batch >= 1 && o.global_batch % o.gpus === 0))
      throw new E.WorkloadError("--global-batch（" + o.global_batch + "）必须是 --gpus（" + o.gpus + "）的正整数倍");
    var hw = cardInfo ? cardHardware(cardInfo) : P.hardware, usable = o.card - P.context_bytes;
    if (usable <= 0) throw new E.WorkloadError("显存小于 CUDA 上下文的预留");
    var r = search(name, p, o, usable, hw), recs = [];
    for (var i = 0; i < r.ranked.length && recs.length < o.top; i++) {
      var rec = recommendation(r.ranked[i][0], p, usable, hw);
      rec.rank = recs.length + 1;
      recs.push(rec);
    }
    return { model: { name: name, family: p.family, params: p.params }, card: cardInfo, card_bytes: o.card,
      context_bytes: P.context_bytes, usable_bytes: usable, allocator_overhead: P.allocator_overhead, bf16: o.bf16,
      gpus: o.gpus, seq: o.seq, global_batch: o.global_batch, lora_rank: o.lora_rank, lora_targets: o.lora_targets,
      hardware: hw, searched: r.scored.length, fitting: r.scored.filter(function (s) { return s.fits; }).length,
      recommendations: recs, skipped: r.leftOut };
  }

  function parseBytes(text) {     // vramlab.units.parse_bytes
    var units = { "": 1, b: 1, k: 1e3, kb: 1e3, kib: 1024, m: 1e6, mb: 1e6, mib: MiB, g: 1e9, gb: 1e9, gib: GiB,
      t: 1e12, tb: 1e12, tib: Math.pow(1024, 4) };
    var m = /^\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*$/.exec(String(text));
    if (!m || !(m[2].toLowerCase() in units))
      throw new E.WorkloadError("不认识的显卡 '" + text + "'：请给型号（" + Object.keys(P.cards).join("、") + "）或显存大小，例如 24GiB");
    var v = parseFloat(m[1]) * units[m[2].toLowerCase()];
    if (!(v > 0)) throw new E.WorkloadError("显存预算必须大于 0，收到 '" + text + "'");
    return Math.trunc(v);
  }

  /** Plan for config text `text` (a config.json), registered as preset cfg:<label> for the estimator. */
  function planFromText(text, label, opts) {
    var cfg;
    try { cfg = JSON.parse(text); }
    catch (err) { throw new ConfigError(label + " 不是合法的 JSON：" + err.message); }
    var p = presetFromConfig(cfg, label), name = "cfg:" + label;
    D.presets[name] = p;
    return makePlan(p, name, opts);
  }

  // ---------------------------------------------------------------- the page
  function fmtBytes(n) {
    var u = [["GiB", GiB], ["MiB", MiB], ["KiB", 1024]];
    for (var i = 0; i < u.length; i++) if (Math.abs(n) >= u[i][1]) return (n / u[i][1]).toFixed(2) + " " + u[i][0];
    return Math.trunc(n) + " B";
  }
  function fmtS(x) {      // plan._s
    return x < 10 ? Math.round(x * 1000).toLocaleString("en-US") + " ms"
      : x.toLocaleString("en-US", { minimumFractionDigits: 1, maximumFractionDigits: 1 }) + " s";
  }
  function el(tag, attrs, text) {
    var e = document.createElement(tag);
    for (var k in attrs || {}) e.setAttribute(k, attrs[k]);
    if (text !== undefined) e.textContent = text;
    return e;
  }
  function field(label, control) {
    var l = el("label", { "class": "vramlab-calc__field" });
    l.appendChild(el("span", { "class": "vramlab-calc__label" }, label));
    l.appendChild(control);
    return l;
  }
  var CAT = D.category_zh;

  function render(out, plan) {
    out.textContent = "";
    out.setAttribute("data-plan", JSON.stringify(plan));
    out.appendChild(el("p", {}, "模型 " + plan.model.name + "（" + plan.model.family + "，" + plan.model.params.toLocaleString("en-US") +
      " 个参数）；每卡 " + fmtBytes(plan.card_bytes) + " × " + plan.gpus + "，扣除 CUDA 上下文后可用 " + fmtBytes(plan.usable_bytes) +
      "；序列 " + plan.seq + "，全局批 " + plan.global_batch + "。搜索了 " + plan.searched + " 种组合，估算装得下的 " + plan.fitting + " 种。"));
    if (!plan.recommendations.length) {
      out.appendChild(el("p", { "class": "vramlab-plan__none" }, "没有装得下的组合：试试更短的序列、更小的全局批，或更多的卡。"));
    }
    plan.recommendations.forEach(function (r) {
      var box = el("div", { "class": "vramlab-plan__rec", "data-rank": String(r.rank) });
      box.appendChild(el("h4", {}, "#" + r.rank + "　" + r.summary));
      box.appendChild(el("p", {}, "估算峰值 " + fmtBytes(r.estimate_bytes) + "（已分配）；按缓存分配器开销计约需 " + fmtBytes(r.need_bytes) +
        "。估计步时 " + fmtS(r.cost.total) + "（计算 " + fmtS(r.cost.compute) + (r.cost.recompute ? "，重算 " + fmtS(r.cost.recompute) : "") +
        (r.cost.offload ? "，卸载 " + fmtS(r.cost.offload) : "") + (r.cost.dequant ? "，反量化 " + fmtS(r.cost.dequant) : "") +
        (r.cost.communication ? "，通信 " + fmtS(r.cost.communication) : "") + "）。"));
      box.appendChild(el("p", {}, "构成：" + Object.keys(r.breakdown).filter(function (k) { return r.breakdown[k]; })
        .map(function (k) { return (CAT[k] || k) + " " + fmtBytes(r.breakdown[k]); }).join("，")));
      var ul = el("ul");
      r.techniques.forEach(function (t) {
        var cost = t.costs_seconds > 1e-9 ? "多花 " + fmtS(t.costs_seconds) + "/步" : (t.costs_seconds < -1e-9 ? "省 " + fmtS(-t.costs_seconds) + "/步" : "不影响步时");
        ul.appendChild(el("li", {}, t.technique + "：" + (t.saves_bytes >= 0 ? "省下 " + fmtBytes(t.saves_bytes) : "多用 " + fmtBytes(-t.saves_bytes)) + "（不用它需 " + fmtBytes(t.without_need_bytes) + "，" +
          (t.without_fits ? "也装得下" : "装不下") + "），" + cost));
      });
      box.appendChild(ul);
      var n = r.next_micro_batch;
      box.appendChild(el("p", {}, n ? "下一档微批次 " + n.batch + "：估计需 " + fmtBytes(n.need_bytes) + "，" + (n.fits_estimate ? "装得下" : "装不下") + "。"
        : "微批次已是每卡批大小的上限（不需要梯度累积），没有更大的一档。"));
      out.appendChild(box);
    });
    if (plan.skipped.length) {
      var shown = plan.skipped.slice(0, 8);
      out.appendChild(el("p", {}, "跳过的方案（" + plan.skipped.length + " 个，列出前 " + shown.length + " 个）："));
      var sk = el("ul", { "class": "vramlab-plan__skipped" });
      shown.forEach(function (x) { sk.appendChild(el("li", {}, x.summary + "：" + x.reason)); });
      out.appendChild(sk);
    }
    out.appendChild(el("p", { "class": "vramlab-plan__note" }, "浏览器里只有估算；命令行 vramlab plan 会把每个方案在模拟设备（FakeTensorMode）上再跑一遍。步时按峰值算力与带宽、不重叠计算，只用于排序。"));
  }

  function build(root) {
    var form = el("form", { "class": "vramlab-calc__form", autocomplete: "off" });
    var sample = el("select", { name: "sample" });
    sample.appendChild(el("option", { value: "" }, "（自己粘贴）"));
    Object.keys(P.samples).forEach(function (k) { sample.appendChild(el("option", { value: k }, k)); });
    var text = el("textarea", { name: "config", rows: "8", spellcheck: "false", placeholder: "把 config.json 的内容粘贴到这里" });
    sample.addEventListener("change", function () { if (sample.value) text.value = JSON.stringify(P.samples[sample.value], null, 2); });
    var card = el("input", { name: "card", type: "text", value: "24GiB", list: "vramlab-plan-cards",
      title: "显卡型号（" + Object.keys(P.cards).join("、") + "）或每卡显存，例如 24GiB" });
    var cardList = el("datalist", { id: "vramlab-plan-cards" });
    Object.keys(P.cards).forEach(function (k) { cardList.appendChild(el("option", { value: k }, P.cards[k].label)); });
    var gpus = el("input", { name: "gpus", type: "number", min: "1", value: "1" });
    var seq = el("input", { name: "seq", type: "number", min: "1", placeholder: "默认 min(2048, 最大位置数)" });
    var gb = el("input", { name: "global_batch", type: "number", min: "1", value: "16" });
    var rank = el("input", { name: "lora_rank", type: "number", min: "1", value: "16" });
    var targets = el("select", { name: "lora_targets" });
    Object.keys(P.targets_zh).forEach(function (k) { targets.appendChild(el("option", { value: k }, P.targets_zh[k])); });
    var meth = el("select", { name: "method" });
    [["any", "都看"], ["full", "全参数微调"], ["lora", "LoRA"], ["qlora", "QLoRA"]].forEach(function (m) { meth.appendChild(el("option", { value: m[0] }, m[1])); });
    [field("示例配置", sample), field("config.json", text), field("每卡显存", card), field("卡数", gpus), field("序列长度", seq),
     field("全局批（序列数）", gb), field("LoRA 秩", rank), field("LoRA 目标模块", targets), field("方法", meth)].forEach(function (f) { form.appendChild(f); });
    form.appendChild(cardList);
    var go = el("button", { type: "submit", name: "go" }, "规划");
    form.appendChild(go);
    var out = el("div", { "class": "vramlab-plan__out", "aria-live": "polite" });
    form.addEventListener("submit", function (ev) {
      ev.preventDefault();
      out.removeAttribute("data-plan");
      try {
        var label = (sample.value && JSON.stringify(P.samples[sample.value], null, 2) === text.value) ? sample.value : "pasted";
        var plan = planFromText(text.value, label, { card: findCard(card.value) || parseBytes(card.value),
          gpus: parseInt(gpus.value, 10) || 1,
          seq: seq.value ? parseInt(seq.value, 10) : null, global_batch: parseInt(gb.value, 10) || 16,
          lora_rank: parseInt(rank.value, 10) || 16, methods: meth.value === "any" ? null : [meth.value],
          lora_targets: targets.value });
        out.removeAttribute("data-error");
        render(out, plan);
      } catch (err) {
        if (!(err instanceof ConfigError) && !(err instanceof E.WorkloadError)) throw err;
        out.textContent = "错误：" + err.message;
        out.setAttribute("data-error", err.message);
      }
    });
    root.textContent = "";
    root.appendChild(form);
    root.appendChild(out);
  }

  global.VramPlan = { presetFromConfig: presetFromConfig, makePlan: makePlan, planFromText: planFromText,
    stepCost: stepCost, parseBytes: parseBytes, ConfigError: ConfigError };
  function init() { Array.prototype.forEach.call(document.querySelectorAll(".vramlab-plan"), build); }
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", init); else init();
})(window);
