/* 显存估算公式：vramlab/estimate.py 的逐行移植（JavaScript，无依赖）。
 *
 * 每个函数对应 estimate.py 里同名的 Python 函数（_Forward 的符号前向、_backward_peak 的反向遍历、
 * estimate() 的各个时刻），算式和求值顺序都保持一致，这样两边得到的字节数完全相同
 * （tests/test_tools_browser.py 在浏览器里逐例核对）。改了 estimate.py 就要同步改这里；
 * 模型形状与常量来自 presets.js（python -m vramlab.webdata 生成）。
 * 数值都在 2^53 以内，JS 的 number 能精确表示整数；Python 的 a // b 写成 Math.floor(a / b)。
 */
(function (global) {
  "use strict";
  var D = global.VRAMLAB_CALC;

  function floorDiv(a, b) { return Math.floor(a / b); }
  function ceilDiv(a, b) { return -Math.floor(-a / b); }
  function sum(xs) { var s = 0; for (var i = 0; i < xs.length; i++) s += xs[i]; return s; }
  function prod(xs) { var s = 1; for (var i = 0; i < xs.length; i++) s *= xs[i]; return s; }
  function isLlama(p) { return p.family === "llama" || p.family === "mixtral"; }
  function values(o) { return Object.keys(o).map(function (k) { return o[k]; }); }

  function WorkloadError(msg) { this.message = msg; this.name = "WorkloadError"; }
  WorkloadError.prototype = Object.create(Error.prototype);

  var DEFAULTS = { model: "gpt2-small", batch: 8, seq: 512, optimizer: "adamw", precision: "fp32",
    checkpointing: "none", attention: "sdpa", dropout: 0.0, lora_rank: 0, zero: 0, gpus: 1, accum: 1,
    offload: "none", foreach: true, inference: false, lora_targets: "default", qlora: false };

  function workload(fields) {
    var w = {};
    for (var k in DEFAULTS) w[k] = (fields && fields[k] !== undefined) ? fields[k] : DEFAULTS[k];
    w.mixed = /-mixed$/.test(w.precision);
    w.param_dtype_name = (w.precision === "bf16" || w.precision === "fp16") ? w.precision : "fp32";
    w.compute_dtype_name = w.precision.split("-")[0];
    return w;
  }
  function withChanges(w, changes) { var o = {}, k; for (k in DEFAULTS) o[k] = w[k]; for (k in changes) o[k] = changes[k]; return workload(o); }

  // workload.py Workload.validate()
  function validate(w) {
    var p = D.presets[w.model];
    if (!p) throw new WorkloadError("未知模型预设 " + w.model);
    var checks = [["optimizer", w.optimizer], ["precision", w.precision], ["checkpointing", w.checkpointing],
      ["attention", w.attention], ["offload", w.offload], ["lora-targets", w.lora_targets]];
    checks.forEach(function (c) {
      var allowed = D.choices[c[0].replace("-", "_")];
      if (allowed.indexOf(c[1]) < 0)
        throw new WorkloadError("--" + c[0] + " 不支持 '" + c[1] + "'；可选：" + allowed.join(", "));
    });
    ["batch", "seq", "accum", "gpus"].forEach(function (k) {
      if (!(Number.isInteger(w[k]) && w[k] >= 1)) throw new WorkloadError("--" + k + " 必须是正整数，收到 " + w[k]);
    });
    if (!(w.dropout >= 0 && w.dropout < 1)) throw new WorkloadError("--dropout 必须在 [0, 1) 之间，收到 " + w.dropout);
    if (!(Number.isInteger(w.lora_rank) && w.lora_rank >= 0)) throw new WorkloadError("--lora-rank 不能为负，收到 " + w.lora_rank);
    if (w.qlora && w.lora_rank === 0) throw new WorkloadError("QLoRA 需要 LoRA：请同时给出 --lora-rank r（r > 0）");
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
  function shapeList(p) { return values(linearShapes(p)); }

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

  function loraTargetNames(p, targets) {
    if (targets === undefined || targets === "default") return D.lora_targets[p.family];
    if (targets === "qkvo") return p.family === "gpt2" ? ["qkv", "o"] : ["q", "k", "v", "o"];
    if (targets === "all-linear")
      return Object.keys(linearShapes(p)).filter(function (k) { return k !== "router"; }).concat(p.family === "bert" ? ["mlm"] : []);
    throw new WorkloadError("--lora-targets 不支持 '" + targets + "'；可选：default、qkvo、all-linear");
  }

  function loraShapes(p, targets) {
    var s = linearShapes(p), names = loraTargetNames(p, targets), one = [], out = [];
    names.forEach(function (t) { if (t !== "mlm") one.push([s[t][0], s[t][1]]); });
    for (var i = 0; i < p.n_layers; i++) out = out.concat(one);
    if (names.indexOf("mlm") >= 0) out.push([p.hidden, p.hidden]);
    return out;
  }

  function loraParams(p, rank, targets) {
    return sum(loraShapes(p, targets).map(function (x) { return rank * (x[0] + x[1]); }));
  }

  function nf4Bytes(n) { var blocks = ceilDiv(n, 64); return floorDiv(n + 1, 2) + blocks + 4 * ceilDiv(blocks, 256); }

  function quantizedShapes(p) {
    var s = linearShapes(p), one = [], out = [];
    Object.keys(s).forEach(function (k) { if (k !== "router") one.push([s[k][0], s[k][1]]); });
    for (var i = 0; i < p.n_layers; i++) out = out.concat(one);
    if (p.family === "bert") out.push([p.hidden, p.hidden]);
    return out;
  }

  function trainableShapes(p, w) {
    var out = [], i;
    if (w.lora_rank) {
      var r = w.lora_rank;
      loraShapes(p, w.lora_targets).forEach(function (x) { out.push([r, x[0]]); out.push([x[1], r]); });
      return out;
    }
    var h = p.hidden, V = p.vocab, lin = {}, s = linearShapes(p);
    Object.keys(s).forEach(function (k) { lin[k] = [[s[k][1], s[k][0]]].concat(s[k][2] ? [[s[k][1]]] : []); });
    var block;
    if (p.family === "gpt2") {
      block = [[h], [h]].concat(lin.qkv, lin.o, [[h], [h]], lin.up, lin.down);
      out = [[V, h], [p.positions, h]];
      for (i = 0; i < p.n_layers; i++) out = out.concat(block);
      return out.concat([[h], [h]]);
    }
    if (p.family === "bert") {
      block = [].concat(lin.q, lin.k, lin.v, lin.o, [[h], [h]], lin.up, lin.down, [[h], [h]]);
      out = [[V, h], [p.positions, h], [2, h], [h], [h]];
      for (i = 0; i < p.n_layers; i++) out = out.concat(block);
      return out.concat([[h, h], [h], [h], [h], [V]]);
    }
    block = [].concat(lin.q, lin.k, lin.v, lin.o);
    if (p.family === "llama") block = block.concat(lin.gate, lin.up, lin.down);
    else block = block.concat(lin.router, [[p.num_local_experts, 2 * p.ffn_hidden, h], [p.num_local_experts, h, p.ffn_hidden]]);
    block = block.concat([[h], [h]]);
    out = [[V, h]];
    for (i = 0; i < p.n_layers; i++) out = out.concat(block);
    return out.concat([[h]], p.tie_word_embeddings ? [] : [[V, h]]);
  }

  // ---------------------------------------------------------------- model states
  function adafactorElements(shape) {
    if (shape.length < 2) return prod(shape);
    return prod(shape.slice(0, shape.length - 2)) * (shape[shape.length - 2] + shape[shape.length - 1]);
  }

  function optimizerStateBytes(opt, n, stateBytes, shapes) {
    if (opt === "sgd") return 0;
    if (opt === "sgdm") return n * stateBytes;
    if (opt === "adamw") return 2 * n * stateBytes;
    if (opt === "adamw8bit") {
      return sum(shapes.map(function (s) {
        var m = prod(s);
        return m < D.bnb_min_8bit_size ? 8 * m : 2 * m + 2 * 4 * ceilDiv(m, D.bnb_blocksize);
      }));
    }
    if (opt === "adafactor") return sum(shapes.map(adafactorElements)) * stateBytes;
    throw new WorkloadError("未知优化器 '" + opt + "'");
  }

  // ---------------------------------------------------------------- the symbolic forward (_Forward)
  function T(n, b, rg, id, base, ghost) {
    this.n = n; this.b = b; this.rg = rg; this.id = id; this.base = base || null; this.ghost = !!ghost;
  }

  function Fwd(w, p, ids, sim) {
    this.w = w; this.p = p; this.sim = !!sim;
    this.tok = w.batch * w.seq;
    this.mixed = w.mixed; this.lora = w.lora_rank > 0; this.train = !this.lora; this.nf4 = w.qlora;
    this.targets = this.lora ? loraTargetNames(p, w.lora_targets) : [];
    this.pb = (w.precision === "fp32" || w.mixed || w.qlora) ? 4 : 2;
    this.cb = D.dtype_bytes[w.compute_dtype_name];
    this.drop = w.dropout > 0; this.accum = w.accum > 1;
    this.gb = (w.zero && w.mixed) ? 2 : this.pb; this.shards = w.zero >= 2 ? w.gpus : 1;
    this.saved = {}; this.savedOrder = []; this.names = []; this.tape = []; this.pending = [];
    this.casts = 0; this.kept = 0; this.cached = 0; this.mute = false; this.inAttn = false;
    this.held = {}; this.refs = {};     // storages the running modules' Python locals reference
    this.fwdPeak = 0; this.fwdPeakRc = 0; this.fwdPeakOff = 0; this.wheld = 0; this.wcache = 0; this.wsave = 0;
    this.modelLocals = []; this.leaf = null; this.ids = ids || 0;
  }
  Fwd.prototype.t = function (n, b, rg) { this.ids += 1; return new T(n, b, rg, this.ids); };
  Fwd.prototype.view = function (x, n) { this.ids += 1; return new T(n, x.b, x.rg, this.ids, x.base || x); };
  Fwd.prototype.save = function (x, name) {
    var s = x.base || x;
    if (!this.mute) {
      if (!(s.id in this.saved)) { this.saved[s.id] = s.n * s.b; this.savedOrder.push(s.id); this.names.push([name, s.n * s.b]); }
      this.pending.push(s.id);
    }
    return x.n * x.b;
  };
  Fwd.prototype.total = function () { var t = 0, s = this.saved; this.savedOrder.forEach(function (id) { t += s[id]; }); return t; };
  Fwd.prototype.hold = function () {
    for (var i = 0; i < arguments.length; i++) {
      var s = arguments[i].base || arguments[i];
      if (!s.ghost) { this.held[s.id] = s.n * s.b; this.refs[s.id] = (this.refs[s.id] || 0) + 1; }
    }
  };
  Fwd.prototype.release = function () {
    for (var i = 0; i < arguments.length; i++) {
      var sid = (arguments[i].base || arguments[i]).id;
      if (sid in this.refs) {
        this.refs[sid] -= 1;
        if (!this.refs[sid]) { delete this.refs[sid]; delete this.held[sid]; }
      }
    }
  };
  // _Forward.moment: saved so far, what locals hold, `alive` (each storage once) and `extra` bytes
  Fwd.prototype.moment = function (alive, extra) {
    var dev = {}, k, devSum = 0, liveSum;
    for (k in this.held) dev[k] = this.held[k];
    alive.forEach(function (x) { var b = x.base || x; if (!b.ghost) dev[b.id] = b.n * b.b; });
    for (k in dev) devSum += dev[k];
    liveSum = devSum;
    for (k in this.saved) if (!(k in dev)) liveSum += this.saved[k];
    extra = extra || 0;
    this.fwdPeak = Math.max(this.fwdPeak, liveSum + extra + this.wcache + this.wsave);
    this.fwdPeakOff = Math.max(this.fwdPeakOff, devSum + extra + this.wcache);
    this.fwdPeakRc = Math.max(this.fwdPeakRc, liveSum + extra + this.wheld);
  };
  // extra: {fwd, grad, early, wcopy, account} (the keyword arguments of _Forward.op)
  Fwd.prototype.op = function (out, ins, unpack, temp, alias, extra) {
    var x = extra || {};
    this.wheld += x.wcopy || 0;
    if (x.account !== false && !out.ghost) this.moment(ins.concat([out]), x.fwd || 0);
    var saved = this.pending; this.pending = [];
    if (out.rg)
      this.tape.push({ out: out, ins: ins.filter(function (t) { return t.rg; }), unpack: unpack || 0, temp: temp || 0,
        alias: !!alias, saved: saved, attn: this.inAttn, grad: x.grad || 0, early: x.early || 0, wcopy: x.wcopy || 0,
        also: [] });
    return out;
  };
  Fwd.prototype.cast = function (x, b) { return x.b === b ? x : this.op(this.t(x.n, b, x.rg), [x]); };
  Fwd.prototype.shape = function (name) {
    if (name === "head") return [this.p.hidden, this.p.vocab];
    if (name === "mlm") return [this.p.hidden, this.p.hidden];
    var s = linearShapes(this.p)[name]; return [s[0], s[1]];
  };
  Fwd.prototype.linear = function (x, name) {
    var io = this.shape(name), i = io[0], o = io[1], y;
    this.hold(x);
    if (this.nf4 && name !== "head") {
      var casts = this.cb !== x.b ? this.tok * (i + o) * this.cb : 0;
      this.moment([x], i * o * this.cb + (casts || this.tok * o * x.b));
      y = this.op(this.t(this.tok * o, x.b, x.rg), [x], nf4Bytes(i * o), i * o * this.cb + casts, false, { fwd: casts });
    } else {
      var xc = this.mixed ? this.cast(x, 2) : x, wb = this.mixed ? 2 : this.pb, unpack = 0, wcopy = 0;
      if (this.train) {
        unpack += this.save(xc, name + " input");
        if (this.mixed && !this.mute) this.cached += i * o * 2;
      } else if (this.mixed && x.rg && !this.mute) this.casts += i * o * 2;
      if (this.mixed && (x.rg || this.train) && !this.w.zero) wcopy = i * o * 2;
      var wcache = (this.mixed && this.train && !this.w.zero) ? i * o * 2 : 0;
      var wsave = (this.mixed && !this.train && x.rg && !this.mute && !this.w.zero) ? i * o * 2 : 0;
      this.wcache += wcache; this.wsave += wsave;
      var transient = (this.mixed && !this.w.zero && !(wcache || wsave)) ? i * o * 2 : 0;
      if (x.rg) unpack += i * o * wb;
      var temp = 0, grad = 0;
      if (this.train) {
        temp = i * o * (this.mixed ? 2 : 0) + (this.accum ? i * o * this.gb : 0);
        grad = this.accum ? 0 : floorDiv(i * o * this.gb, this.shards);
      }
      y = this.op(this.t(this.tok * o, this.mixed ? 2 : x.b, x.rg || this.train), [xc], unpack, temp, false,
        { grad: grad, wcopy: wcopy, fwd: transient });
    }
    if (this.targets.indexOf(name) >= 0) y = this.adapter(x, y, name);
    this.release(x);
    return y;
  };
  // _Forward.adapter (peft's lora.Linear.forward)
  Fwd.prototype.adapter = function (x, y, name) {
    var io = this.shape(name), i = io[0], o = io[1], r = this.w.lora_rank, n = this.tok * o;
    this.hold(y);
    var x32 = this.cast(x, 4);
    this.hold(x32);
    var xa = this.mixed ? this.op(this.t(x.n, 2, x.rg), [x32]) : x32;
    var ab = this.mixed ? 2 : 4;
    var a = this.op(this.t(this.tok * r, ab, true), [xa], this.save(xa, name + " lora_A input") + r * i * ab, 0, false,
      { grad: this.accum ? 0 : r * i * 4 });
    var lo = this.op(this.t(n, ab, true), [a], this.save(a, name + " lora_A output") + r * o * ab, 0, false,
      { grad: this.accum ? 0 : r * o * 4 });
    if (this.mixed && !this.mute) this.cached += r * (i + o) * 2;
    var sb = Math.max(y.b, ab);
    this.moment([lo], n * ab);
    this.moment([], n * ab + n * sb);
    this.release(y);
    var out = this.op(this.t(y.n, y.b, true), [y, this.castGrad(lo, y.b)], 0, 0, true, { account: false });
    if (sb !== y.b) this.moment([], n * sb + n * y.b);
    this.release(x32);
    return out;
  };
  Fwd.prototype.layernorm = function (x, name) {
    if (!(x.rg || this.train)) return this.t(x.n, this.mixed ? 4 : x.b, false);
    var xs = this.mixed ? this.cast(x, 4) : x;
    var u = this.save(xs, name + " input") + this.save(this.t(2 * this.tok, 4, false), name + " mean/rstd");
    return this.op(this.t(x.n, xs.b, true), [xs], u);
  };
  Fwd.prototype.rmsnorm = function (x, name) {
    var outB = Math.max(this.pb, x.b);
    if (!(x.rg || this.train)) return this.t(x.n, outB, false);
    var h32 = this.cast(x, 4), u = 0;
    this.moment([x, h32], x.n * 4);
    if (x.rg) u += this.save(h32, name + " x.float()") + this.save(this.t(this.tok, 4, false), name + " rsqrt");
    if (this.train) u += this.save(this.t(x.n, x.b, true), name + " normalised");
    var fwd = (x.b !== 4 ? x.n * 4 : 0) + (this.train ? 0 : x.n * x.b);
    return this.op(this.t(x.n, outB, true), [h32], u, 2 * x.n * 4, false, { fwd: fwd });
  };
  Fwd.prototype.dropout = function (x, name) {
    if (!this.drop) return x;
    var u = x.rg ? this.save(this.t(x.n, 1, false), name + " dropout mask") : 0;
    return this.op(this.t(x.n, x.b, x.rg), [x], u);
  };
  Fwd.prototype.castGrad = function (x, b) {     // a gradient's cast: no tensor in the forward
    if (x.b === b) return x;
    this.ids += 1;
    return this.op(new T(x.n, b, x.rg, this.ids, null, true), [x]);
  };
  Fwd.prototype.add = function (a, b) {
    var out = this.t(a.n, Math.max(a.b, b.b), a.rg || b.rg);
    return this.op(out, [this.castGrad(a, out.b), this.castGrad(b, out.b)], 0, 0, true);
  };
  Fwd.prototype.geluNew = function (u) {
    if (!u.rg) return this.t(u.n, u.b, false);
    var x32 = (u.b === 4 || !this.mixed) ? u : this.t(u.n, 4, true), tb = this.mixed ? 4 : u.b;
    this.save(x32, "gelu: x for x³");
    this.save(this.t(u.n, tb, true), "gelu: tanh");
    this.save(this.t(u.n, tb, true), "gelu: 1+tanh");
    this.save(this.t(u.n, u.b, true), "gelu: 0.5·x");
    return this.op(this.t(u.n, Math.max(u.b, tb), true), [u], x32.n * x32.b, 3 * u.n * tb + u.n * u.b, false,
      { early: u.n * (tb + 2 * u.b) });
  };
  Fwd.prototype.gelu = function (u) {
    var s = u.rg ? this.save(u, "gelu input") : 0;
    return this.op(this.t(u.n, u.b, u.rg), [u], s);
  };
  Fwd.prototype.swiglu = function (x) {
    var g = this.linear(x, "gate");
    var s = this.op(this.t(g.n, g.b, g.rg), [g], g.rg ? this.save(g, "gate") : 0);
    this.hold(s);
    var u = this.linear(x, "up");
    var unpack = (u.rg ? this.save(s, "silu(gate)") : 0) + (s.rg ? this.save(u, "up") : 0);
    var m = this.op(this.t(g.n, Math.max(s.b, u.b), s.rg || u.rg), [s, u], unpack);
    this.release(s);
    return this.linear(m, "down");
  };
  Fwd.prototype.contiguous = function (x) { return x.base === null ? x : this.op(this.t(x.n, x.b, x.rg), [x]); };
  Fwd.prototype.attention = function (q, k, v, qkv) {
    var self = this, p = this.p, w = this.w, rg = q.rg || k.rg || v.rg, hd = p.head_dim, qd = p.heads * hd;
    var low = this.mixed ? function (x) { return self.cast(x, 2); } : function (x) { return x; };
    var ob = this.mixed ? 2 : q.b;
    var ins = (qkv && !(this.mixed && qkv.b === 4)) ? [qkv] : null;
    var q2, k2, v2, out, u;
    if (w.attention === "sdpa") {
      q2 = low(q); k2 = low(k); v2 = low(v);
      out = this.t(this.tok * qd, ob, rg);
      var lse = this.t(w.batch * p.heads * Math.ceil(w.seq / 32) * 32, 4, false);
      u = 0;
      if (rg) u = this.save(q2, "q, k, v") + this.save(k2, "q, k, v") + this.save(v2, "q, k, v") +
        this.save(out, "attention output") + this.save(lse, "logsumexp");
      var flash = q2.b === 2 && p.kv_heads === p.heads && hd <= 256 && hd % 8 === 0;
      var temp = lse.n * 4 + (flash ? w.batch * w.seq * p.heads * Math.ceil(hd / 32) * 32 * 4 : 0);
      if (ins !== null) temp += qkv.n * qkv.b;
      return this.op(out, ins || [q2, k2, v2], u, temp);
    }
    var scores = w.batch * p.heads * w.seq * w.seq;
    var rep = isLlama(p) && p.kv_heads < p.heads;
    if (rep) {
      k = this.op(this.t(this.tok * qd, k.b, k.rg), [k]);
      v = this.op(this.t(this.tok * qd, v.b, v.rg), [v]);
      this.hold(k, v);
    }
    q2 = this.contiguous(low(q)); k2 = this.contiguous(low(k));
    var sIn = (this.mixed || q.b === 2) ? 2 : 4;
    var sm = (isLlama(p) || this.mixed || q.b === 4) ? 4 : 2;
    var pm = this.mixed ? 2 : q.b;
    var qk = this.op(this.t(scores, sIn, rg), [q2, k2], rg ? this.save(q2, "q (matmul)") + this.save(k2, "k (matmul)") : 0);
    qk = this.op(this.t(scores, sIn, rg), [qk]);
    var probs = this.t(scores, sm, rg), weights;
    if (this.sim && sm === 4 && sIn === 2) qk = this.cast(qk, 4);
    probs = this.op(probs, [qk], rg ? this.save(probs, "softmax(scores)") : 0);
    var pd = isLlama(p) ? q.b : (p.family === "gpt2" ? v.b : sm);
    if (this.drop) {
      var mask = rg ? this.save(this.t(scores, 1, false), "attention dropout mask") : 0;
      probs = weights = this.op(this.t(scores, pd, rg), [this.cast(probs, pd)], mask);
      probs = this.cast(probs, pm);
      if (rg) this.save(probs, "attention dropout output");
    } else {
      weights = probs;
      probs = this.cast(probs, pm);
      if (pd !== weights.b) weights = probs;
      if (rg) this.save(probs, "probabilities (matmul)");
    }
    this.hold(weights);
    v2 = this.contiguous(low(v));
    var unpackPv = rg ? probs.n * probs.b + this.save(v2, "v (matmul)") : 0;
    out = this.t(this.tok * qd, ob, rg);
    out = this.op(out, [probs, v2], unpackPv, this.tok * qd * ob, false, { fwd: this.tok * qd * ob });
    if (rep) this.release(k, v);
    return out;
  };
  Fwd.prototype.moe = function (x) {
    var p = this.p, n = this.tok, h = p.hidden, f = p.ffn_hidden, k = p.num_experts_per_tok, e = p.num_local_experts;
    var a = this.mixed ? 2 : x.b, rows = k * n, rg = x.rg || this.train, u = 0;
    if (rg) u += this.save(this.t(n * e * (a + 4), 1, false), "router logits, softmax");
    if (this.train) u += this.save(this.t(rows * h, a, false), "expert inputs");
    if (x.rg) u += e * 2 * f * h * this.pb;
    var gu = this.op(this.t(rows * 2 * f, a, rg), [x], u, rows * h * a, false,
      { fwd: rows * h * a + rows * 2 * f * a, grad: (this.accum || !this.train) ? 0 : floorDiv(e * 2 * f * h * this.gb, this.shards) });
    u = rg ? this.save(gu, "gate, up") + this.save(this.t(rows * f, a, rg), "silu(gate)") : 0;
    var prod = this.op(this.t(rows * f, a, rg), [gu], u, 0, false, { fwd: rows * f * a });
    u = this.train ? this.save(prod, "down input") : 0;
    if (rg) u += this.save(this.t(rows * h, a, false), "expert outputs");
    if (x.rg) u += e * h * f * this.pb;
    return this.op(this.t(n * h, a, rg), [prod], u, 2 * rows * h * a, false,
      { fwd: 3 * rows * h * a, grad: (this.accum || !this.train) ? 0 : floorDiv(e * h * f * this.gb, this.shards) });
  };
  Fwd.prototype.checkpointed = function (x, run) {
    var sel = this.w.checkpointing === "selective";
    if (sel) {
      this.kept += x.n * x.b;
      if (this.w.offload !== "activations" || kwargCheckpointInput(this.w, this.p)) this.hold(x);
    }
    this.mute = sel; this.inAttn = true;
    var y = run.call(this, x);
    this.mute = false; this.inAttn = false;
    return y;
  };
  // _Forward.embeddings (LoRA + full checkpointing: enable_input_require_grads makes the output a leaf)
  Fwd.prototype.embeddings = function () {
    var p = this.p, h = p.hidden, leaf = this.lora && this.w.checkpointing === "full";
    var x = this.t(this.tok * h, this.pb, this.train || leaf);
    this.leaf = leaf ? x : null;
    this.modelLocals = [x];
    if (p.family === "gpt2") {
      var pos = this.t(this.w.seq * h, this.pb, this.train);
      this.modelLocals.push(pos);
      x = this.op(this.t(x.n, x.b, x.rg || pos.rg), [x, pos], 0, 0, true);
    }
    if (p.family === "bert") x = this.layernorm(x, "embeddings LayerNorm");
    if (p.family === "gpt2" || p.family === "bert") x = this.dropout(x, "embeddings");
    if (p.family === "bert") this.modelLocals = [x];
    return x;
  };
  // _Forward.block: holds mirror the Python locals of HF's modules
  Fwd.prototype.block = function (x) {
    var f = this.p.family, r, d, a, y, h, h2;
    this.hold(x);
    if (f === "gpt2") {
      h = this.layernorm(x, "ln_1");
      this.hold(h);
      a = this.checkpointed(h, function (h) {
        var qkv = this.linear(h, "qkv");
        this.hold(qkv);
        var q = this.view(qkv, qkv.n / 3), k = this.view(qkv, qkv.n / 3), v = this.view(qkv, qkv.n / 3);
        if (qkv.rg) this.tape.push({ out: q, ins: [qkv], unpack: 0, temp: 0, alias: false, saved: [], attn: this.inAttn,
          grad: 0, early: 0, wcopy: 0, also: [k, v] });
        var o = this.dropout(this.linear(this.attention(q, k, v, qkv), "o"), "attention output");
        this.release(qkv);
        return o;
      });
      this.release(h);
      r = this.add(x, a);
      this.hold(r);
      h2 = this.layernorm(r, "ln_2");
      this.hold(h2);
      var u = this.linear(h2, "up");
      d = this.dropout(this.linear(this.geluNew(u), "down"), "MLP output");
      this.release(h2);
      y = this.add(r, d);
      this.release(r, x);
      return y;
    }
    if (f === "bert") {
      a = this.checkpointed(x, function (x) {
        var q = this.linear(x, "q"), k = this.linear(x, "k"), v = this.linear(x, "v");
        this.hold(q, k, v);
        var o = this.attention(q, k, v);
        this.release(q, k, v);
        o = this.dropout(this.linear(o, "o"), "attention output");
        return this.layernorm(this.add(o, x), "attention LayerNorm");
      });
      this.hold(a);
      d = this.dropout(this.linear(this.gelu(this.linear(a, "up")), "down"), "output");
      y = this.layernorm(this.add(d, a), "output LayerNorm");
      this.release(a, x);
      return y;
    }
    h = this.rmsnorm(x, "input RMSNorm");
    this.hold(h);
    a = this.checkpointed(h, function (h) {
      var q = this.linear(h, "q"), k = this.linear(h, "k"), v = this.linear(h, "v");
      this.hold(q, k, v);
      var qb = Math.max(q.b, this.pb), kb = Math.max(k.b, this.pb);
      var q2 = this.op(this.t(q.n, qb, q.rg), [q], 0, q.n * qb, false, { fwd: 2 * q.n * qb });
      this.hold(q2);
      var k2 = this.op(this.t(k.n, kb, k.rg), [k], 0, k.n * kb, false, { fwd: 2 * k.n * kb });
      this.hold(k2);
      this.release(q, k);
      var o = this.linear(this.attention(q2, k2, v), "o");
      this.release(q2, k2, v);
      return o;
    });
    this.release(h);
    r = this.add(x, a);
    this.hold(r);
    h2 = this.rmsnorm(r, "post-attention RMSNorm");
    this.hold(h2);
    d = f === "llama" ? this.swiglu(h2) : this.moe(h2);
    this.release(h2);
    y = this.add(r, d);
    this.release(r, x);
    return y;
  };
  Fwd.prototype.head = function (x) {
    var f = this.p.family;
    if (f === "gpt2") x = this.layernorm(x, "ln_f");
    else if (f === "bert") x = this.layernorm(this.gelu(this.linear(x, "mlm")), "MLM LayerNorm");
    else x = this.rmsnorm(x, "final RMSNorm");
    return this.linear(x, "head");
  };

  // _backward_peak
  function backwardPeak(tape, gradOut, saved, savedOrder, offload, recompute) {
    function resident(op) { return !offload || recompute === "full" || (recompute === "selective" && op.attn); }
    var keep = {}, i, j;
    tape.forEach(function (op) { if (resident(op)) op.saved.forEach(function (sid) { keep[sid] = true; }); });
    var remaining = {}, remOrder = [];
    savedOrder.forEach(function (sid) { if (keep[sid]) { remaining[sid] = saved[sid]; remOrder.push(sid); } });
    var later = {}, laterOrder = [];
    if (recompute === "selective") {
      var attn = {};
      tape.forEach(function (op) { if (op.attn) op.saved.forEach(function (sid) { attn[sid] = true; }); });
      remOrder = remOrder.filter(function (sid) {
        if (attn[sid]) { later[sid] = remaining[sid]; laterOrder.push(sid); delete remaining[sid]; return false; }
        return true;
      });
    }
    tape.forEach(function (op, idx) {
      if (op.wcopy && resident(op)) {
        var key = "w" + idx;
        if (recompute === "selective" && op.attn) { later[key] = op.wcopy; laterOrder.push(key); }
        else { remaining[key] = op.wcopy; remOrder.push(key); }
      }
    });
    var refs = {};
    tape.forEach(function (op) { op.saved.forEach(function (sid) { refs[sid] = (refs[sid] || 0) + 1; }); });
    var live = {}, liveOrder = [];
    function liveSum() { var s = 0; liveOrder.forEach(function (id) { if (id in live) s += live[id]; }); return s; }
    function setLive(id, v) { if (!(id in live)) liveOrder.push(id); live[id] = v; }
    setLive(gradOut.id, gradOut.n * gradOut.b);
    var held = 0;
    remOrder.forEach(function (sid) { held += remaining[sid]; });
    var peak = held + live[gradOut.id];
    for (i = tape.length - 1; i >= 0; i--) {
      var op = tape[i];
      if (!(op.out.id in live)) continue;
      var g = live[op.out.id];
      if (op.attn && laterOrder.length) {
        laterOrder.forEach(function (sid) { held += later[sid]; remaining[sid] = later[sid]; });
        laterOrder = []; later = {};
      }
      var aliases = op.ins.filter(function (x) { return op.alias && x.b === op.out.b; });
      var newIds = [], newSize = {};
      op.ins.forEach(function (x) {
        if (aliases.indexOf(x) >= 0) return;
        if (!(x.id in newSize)) { newSize[x.id] = 0; newIds.push(x.id); }
        newSize[x.id] += x.n * x.b;
      });
      held += op.grad;
      var mem = held + liveSum() + sum(newIds.map(function (id) { return newSize[id]; })) + op.temp +
        (resident(op) ? -op.early : op.unpack);
      peak = Math.max(peak, mem);
      delete live[op.out.id];
      op.also.forEach(function (x) { delete live[x.id]; });
      var keeper = null;
      aliases.forEach(function (x) { if (keeper === null || x.id < keeper) keeper = x.id; });
      aliases.forEach(function (x) { if (!(x.id in live)) setLive(x.id, x.id === keeper ? g : 0); });
      newIds.forEach(function (id) { if (!(id in live)) setLive(id, newSize[id]); });
      for (j = 0; j < op.saved.length; j++) {
        var sid = op.saved[j];
        refs[sid] -= 1;
        if (refs[sid] === 0 && (sid in remaining)) { held -= remaining[sid]; delete remaining[sid]; }
      }
      if (("w" + i) in remaining) { held -= remaining["w" + i]; delete remaining["w" + i]; }
    }
    return peak;
  }

  // _forward
  function forward(w, p, recompute, sim) {
    var f = new Fwd(w, p, 0, sim);
    var xIn = f.embeddings();
    var f1 = new Fwd(w, p, f.ids, sim);
    var x = f1.block(xIn);
    var f2 = new Fwd(w, p, f1.ids, sim);
    var y = f2.block(x);
    var f3 = new Fwd(w, p, f2.ids, sim);
    var logits = f3.head(y);
    var out = { block_input: xIn.n * xIn.b, logits_bytes_per_elem: logits.b, first_fwd: f1.fwdPeak, rest_fwd: f2.fwdPeak,
      first_fwd_rc: f1.fwdPeakRc, rest_fwd_rc: f2.fwdPeakRc, rest_fwd_off: f2.fwdPeakOff, out_bytes: y.n * y.b,
      rest_wcache: f2.wcache, rest_wsave: f2.wsave, first_saves_input: xIn.id in f1.saved, rest_saves_input: x.id in f2.saved };
    var off0 = w.offload === "activations", counted = {};
    if (!off0) {
      Object.keys(f.saved).forEach(function (k) { counted[k] = true; });
      if (w.checkpointing !== "full") Object.keys(f1.saved).forEach(function (k) { counted[k] = true; });
      else counted[xIn.id] = true;
    }
    var leaf = f.leaf;
    out.leaf = (leaf === null || (leaf.id in counted)) ? 0 : leaf.n * leaf.b;
    out.model_held = sum(f.modelLocals.filter(function (t) { return !(t.id in counted) && t !== leaf; })
      .map(function (t) { return t.n * t.b; }));
    [["emb", f], ["first", f1], ["rest", f2], ["head", f3]].forEach(function (pf) {
      out[pf[0]] = pf[1].total(); out[pf[0] + "_casts"] = pf[1].casts; out[pf[0] + "_kept"] = pf[1].kept;
      out[pf[0] + "_cached"] = pf[1].cached;
    });
    out.first_grads = sum(f1.tape.map(function (op) { return op.grad; }));
    var rc = recompute || w.checkpointing, off = w.offload === "activations";
    out.first_ws = backwardPeak(f1.tape, x, f1.saved, f1.savedOrder, off, rc);
    out.rest_ws = backwardPeak(f2.tape, y, f2.saved, f2.savedOrder, off, rc);
    return out;
  }

  // _kwarg_checkpoint_input
  function kwargCheckpointInput(w, p) { return w.checkpointing === "selective" && (p.family === "llama" || p.family === "mixtral"); }

  // _activations
  function activations(w, p, sim) {
    var fw = forward(w, p, null, sim), L = p.n_layers;
    var parts = w.checkpointing === "full" ? ["emb", "head"] : ["emb", "first", "rest", "head"];
    var mult = { emb: 1, first: 1, rest: L - 1, head: 1 };
    function total(suffix) { return sum(parts.map(function (k) { return mult[k] * fw[k + suffix]; })); }
    var saved = total(""), casts = total("_casts"), cached = total("_cached"), kept = total("_kept");
    if (w.checkpointing === "full") kept = L * fw.block_input;
    // positional checkpoint inputs are offloaded; a keyword one stays in the recompute closure
    if (w.offload === "activations") { saved = 0; casts = 0; cached = 0; if (!kwargCheckpointInput(w, p)) kept = 0; }
    return { total: saved + kept, saved: saved, kept: kept, casts: casts, cached: cached, forward: fw };
  }

  function activationBytes(w, p) { return activations(w, p, false).total; }

  function logitsBytes(w, p, lb) {
    var nv = w.batch * w.seq * p.vocab;
    var lossB = (p.family === "bert" && lb === 2 && !w.mixed) ? 2 : 4;
    var labels = 8 * w.batch * w.seq;
    return { forward_end: nv * (lb + (lb !== lossB ? lossB : 0) + lossB) + labels, backward_start: 3 * nv * lossB + labels };
  }

  // ---------------------------------------------------------------- the estimate
  function optimizerTempBytes(w, shapes, sBytes) {
    if (w.optimizer === "sgd" || w.optimizer === "sgdm" || w.optimizer === "adamw8bit") return 0;
    var n = shapes.map(prod);
    if (w.foreach) return sum(n) * sBytes;
    var k = w.optimizer === "adamw" ? 2 : 1, best = 0;
    for (var i = 0; i < n.length; i++) best = Math.max(best, k * n[i] + (i ? n[i - 1] : 0));
    return best * sBytes;
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

  function row(parameters, gradients, state, acts, logits, temporaries, overhead) {
    return { parameters: parameters, gradients: gradients, optimizer_state: state, activations: acts,
      logits_and_loss: logits, temporaries: temporaries, cuda_overhead: overhead };
  }

  function estimate(fields, qlora) {
    if (qlora) { fields = Object.assign({}, fields); fields.qlora = true; }
    var w = validate(workload(fields));
    var p = D.presets[w.model];
    if (w.inference) return estimateInference(w, p);
    if (w.qlora && p.family === "mixtral")
      throw new WorkloadError("Mixtral 的专家权重是 3 维参数，不是 nn.Linear：bitsandbytes 不会把它们量化成 4 位，而 prepare_model_for_kbit_training 会把它们升为 FP32。vramlab 不估算 MoE 的 QLoRA");
    var params = paramCount(p), lora = w.lora_rank > 0;
    var shapes = trainableShapes(p, w), trainable = sum(shapes.map(prod));
    var nDev = w.zero ? w.gpus : 1;
    var pb = (w.precision === "fp32" || w.mixed || w.qlora) ? 4 : 2;
    var baseW;
    if (w.qlora) {
      var q = quantizedShapes(p), nq = sum(q.map(function (x) { return x[0] * x[1]; }));
      baseW = sum(q.map(function (x) { return nf4Bytes(x[0] * x[1]); })) + (params - nq) * 4;
    } else baseW = params * pb;
    var weights, wBytes, gBytes, sBytes;
    if (lora) { weights = baseW + trainable * 4; wBytes = 4; gBytes = 4; sBytes = 4; }
    else if (w.zero && w.mixed) { weights = params * 2; wBytes = 2; gBytes = 2; sBytes = 4; }
    else { weights = baseW; wBytes = pb; gBytes = pb; sBytes = pb; }
    var grads = trainable * gBytes;
    var state = optimizerStateBytes(w.optimizer, trainable, sBytes, shapes);
    if (w.zero && w.mixed && !lora) state += params * 4;
    if (w.zero >= 1) state = floorDiv(state, nDev);
    if (w.zero >= 2) grads = floorDiv(grads, nDev);
    if (w.zero >= 3) weights = floorDiv(weights, nDev);

    var acts = activations(w, p, false), fw = acts.forward, act = acts.total;
    var cache = 0;
    if (w.mixed && !w.zero) cache = !lora ? matmulWeightParams(p) * 2 : trainable * 2;
    var cachedBwd = !w.zero ? acts.cached : 0, casts = acts.casts;
    var lg = logitsBytes(w, p, fw.logits_bytes_per_elem);
    var ws = 2 * D.cublas_workspace_bytes;
    var gradsNow = w.accum > 1 ? grads : 0;
    var tied = p.family === "gpt2" || p.family === "bert" || !!p.tie_word_embeddings;
    var embGrad = !lora ? floorDiv(p.vocab * p.hidden * gBytes, w.zero >= 2 ? nDev : 1) : 0;

    var ckpt = w.checkpointing, off = w.offload === "activations";
    var full = ckpt === "none" ? fw : forward(withChanges(w, { checkpointing: "none" }), p, ckpt, false);
    var ownRest = ckpt === "full" ? (off ? 0 : fw.block_input) : (off ? (kwargCheckpointInput(w, p) ? fw.rest_kept : 0) : fw.rest + fw.rest_kept);
    var wsRest = full.rest_ws, wsFirst = full.first_ws;
    if (ckpt === "full") {
      wsRest = Math.max(wsRest + (full.rest_saves_input ? 0 : fw.block_input), full.rest_fwd_rc + fw.out_bytes);
      wsFirst = Math.max(wsFirst + (full.first_saves_input ? 0 : fw.block_input), full.first_fwd_rc + fw.out_bytes);
    } else if (ckpt === "selective") { wsRest += fw.rest_kept; wsFirst += fw.first_kept; }
    var fwdLast = ckpt === "full" ? 0 : (!off ? fw.rest_fwd : fw.rest_fwd_off);
    var notYet = ckpt === "full" ? 0 : fw.rest_wcache + (off ? 0 : fw.rest_wsave);
    notYet += (!w.zero ? fw.head_cached : 0) + (off ? 0 : fw.head_casts);
    var leaf = fw.leaf;
    var mask = (w.attention === "eager" && p.family !== "bert") ? w.batch * w.seq * w.seq * pb : 0;
    var keptMask = ckpt !== "none" ? mask : 0;
    var embSaved = off ? 0 : fw.emb;
    var headCopies = off ? 0 : fw.head_casts + (!w.zero ? fw.head_cached : 0);
    var restCopies = (off || ckpt === "full") ? 0 : fw.rest_casts + (!(w.zero || lora) ? fw.rest_cached : 0);

    var tempOpt = floorDiv(optimizerTempBytes(w, shapes, sBytes), w.zero ? nDev : 1);
    var gather = w.zero === 3 ? 2 * blockParams(p) * wBytes : 0;
    var headGradNow = lora ? 0 : p.vocab * p.hidden * gBytes;
    var headUnpack = 0;
    if (w.offload === "activations") headUnpack = p.vocab * p.hidden * (w.mixed ? 2 : pb) + w.batch * w.seq * p.hidden * pb;

    var phases = {
      block_forward: row(weights + cache + casts - notYet, gradsNow, state,
        act - ownRest - (off ? 0 : fw.head) + fw.model_held + leaf + mask, 0, gather + fwdLast, ws),
      forward_end: row(weights + cache + casts, gradsNow, state, act + leaf + keptMask, lg.forward_end, gather, ws),
      backward_start: row(weights + cachedBwd + casts, gradsNow, state, act + leaf + keptMask, lg.backward_start, gather, ws),
      head_backward: row(weights + cachedBwd + casts, gradsNow + headGradNow, state, act + leaf + keptMask,
        w.batch * w.seq * (p.vocab * fw.logits_bytes_per_elem + 8) + headUnpack, gather, ws),
      block_backward: row(weights + cachedBwd + casts - headCopies - restCopies, gradsNow + headGradNow,
        state, act - ownRest - (off ? 0 : fw.head) + leaf + keptMask, 0, gather + wsRest, ws),
      backward_end: row(weights, grads - full.first_grads - ((tied || w.accum > 1) ? 0 : embGrad), state,
        embSaved + leaf + keptMask, 0, gather + wsFirst, ws),
      optimizer_step: row(weights, grads, state, 0, 0, tempOpt, ws)
    };
    var order = ["block_forward", "forward_end", "backward_start", "head_backward", "block_backward", "backward_end",
      "optimizer_step"];
    var extra = (tied ? embGrad : 0) + (w.accum > 1 ? embGrad : 0);
    if (extra) { phases.embedding_backward = row(weights, grads, state, 0, 0, extra, ws); order.push("embedding_backward"); }
    return finish(w, phases, params, trainable, order);
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
    var r = row(params * weightB + cache, 0, 0, 0, inBlock ? 0 : logits, inBlock ? blockWs : 0, D.cublas_workspace_bytes);
    return finish(w, { prefill: r }, params, 0, ["prefill"]);
  }

  // ---------------------------------------------------------------- cards
  function fitVerdict(totalBytes, cardGb) {   // webdata.fit_verdict
    var cap = cardGb * 1e9;
    if (totalBytes + D.context_reserve_bytes <= cap) return "fits";
    return totalBytes <= cap ? "tight" : "no";
  }

  global.VramEstimate = { estimate: estimate, validate: validate, workload: workload, paramCount: paramCount,
    loraParams: loraParams, fitVerdict: fitVerdict, WorkloadError: WorkloadError, withChanges: withChanges,
    // for plan.js (vramlab.plan's cost model)
    matmulWeightParams: matmulWeightParams, linearShapes: linearShapes, activationBytes: activationBytes };
})(window);
