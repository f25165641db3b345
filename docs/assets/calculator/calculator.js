/* 显存计算器的界面：读表单 → VramEstimate.estimate()（estimate.js）→ 画条形图、判断放不放得下。
 *
 * 页面里每个 <div class="vramlab-calc"> 是一个计算器（docs/hooks/calculator.py 由标记生成）；
 * data-* 属性给出初始设置，data-compact 表示章节里的小号版本。没有外部库，条形图用 div 画。
 * 结果也写在 data-total-bytes、data-bytes、data-verdict 属性上，方便测试核对。
 */
(function () {
  "use strict";
  var D = window.VRAMLAB_CALC, E = window.VramEstimate;
  if (!D || !E) return;
  var MiB = 1024 * 1024, GiB = 1024 * MiB;

  var LABELS = {
    precision: { "fp32": "FP32", "bf16": "BF16（纯 16 位）", "fp16": "FP16（纯 16 位）",
      "bf16-mixed": "BF16 混合精度（autocast）", "fp16-mixed": "FP16 混合精度（autocast）" },
    optimizer: { sgd: "SGD", sgdm: "SGD + 动量", adamw: "AdamW", adamw8bit: "8-bit AdamW", adafactor: "Adafactor" },
    checkpointing: { none: "不用", full: "全量激活检查点", selective: "选择性重算（注意力）" },
    attention: { sdpa: "SDPA（FlashAttention 等）", eager: "eager（显式 softmax）" },
    offload: { none: "不卸载", activations: "激活值存到主存（save_on_cpu）" },
    lora_targets: { "default": "peft 默认（q、v / GPT-2 的 c_attn）", qkvo: "注意力 q/k/v/o", "all-linear": "全部线性层" }
  };
  var COLORS = { parameters: "#3f51b5", gradients: "#e91e63", optimizer_state: "#ff9800", activations: "#4caf50",
    logits_and_loss: "#9c27b0", temporaries: "#00acc1", cuda_overhead: "#757575" };
  var VERDICT = { fits: "放得下", tight: "偏紧", no: "放不下" };

  function fmtBytes(n) {        // 与 vramlab.units.fmt_bytes 相同：二进制单位，两位小数
    var units = [["GiB", GiB], ["MiB", MiB], ["KiB", 1024]];
    for (var i = 0; i < units.length; i++) if (Math.abs(n) >= units[i][1]) return (n / units[i][1]).toFixed(2) + " " + units[i][0];
    return Math.trunc(n) + " B";
  }
  function group(n) { return String(n).replace(/\B(?=(\d{3})+(?!\d))/g, ","); }
  function el(tag, attrs, text) {
    var e = document.createElement(tag);
    for (var k in attrs || {}) e.setAttribute(k, attrs[k]);
    if (text !== undefined) e.textContent = text;
    return e;
  }
  function select(name, values, labels) {
    var s = el("select", { name: name });
    values.forEach(function (v) { s.appendChild(el("option", { value: String(v) }, labels ? labels[v] || v : String(v))); });
    return s;
  }
  function number(name, min, step) { return el("input", { type: "number", name: name, min: String(min), step: step || "1" }); }
  function checkbox(name) { return el("input", { type: "checkbox", name: name }); }
  function field(label, control, hint) {
    var l = el("label", { "class": "vramlab-calc__field" });
    l.appendChild(el("span", { "class": "vramlab-calc__label" }, label));
    l.appendChild(control);
    if (hint) l.appendChild(el("small", {}, hint));
    return l;
  }

  function modelLabel(name) {
    var p = D.presets[name];
    return name + "（" + (p.params / 1e6).toFixed(p.params < 1e7 ? 2 : 0) + "M 参数）";
  }

  function buildForm(root) {
    var compact = root.hasAttribute("data-compact");
    var form = el("form", { "class": "vramlab-calc__form", autocomplete: "off" });
    var names = Object.keys(D.presets), labels = {};
    names.forEach(function (n) { labels[n] = modelLabel(n); });
    var main = el("div", { "class": "vramlab-calc__grid" });
    main.appendChild(field("模型", select("model", names, labels)));
    main.appendChild(field("精度", select("precision", D.choices.precision, LABELS.precision)));
    main.appendChild(field("优化器", select("optimizer", D.choices.optimizer, LABELS.optimizer)));
    main.appendChild(field("批大小（micro-batch）", number("batch", 1)));
    main.appendChild(field("序列长度", number("seq", 1)));
    main.appendChild(field("激活检查点", select("checkpointing", D.choices.checkpointing, LABELS.checkpointing)));
    main.appendChild(field("LoRA 秩", number("lora_rank", 0), "0 = 全量微调"));
    main.appendChild(field("LoRA 目标模块", select("lora_targets", D.choices.lora_targets, LABELS.lora_targets)));
    main.appendChild(field("ZeRO 阶段", select("zero", [0, 1, 2, 3], { 0: "0（不分片）", 1: "1：分片优化器状态", 2: "2：再分片梯度", 3: "3：再分片参数" })));
    main.appendChild(field("GPU 数", number("gpus", 1), "ZeRO 按这么多卡分片"));
    main.appendChild(field("卸载", select("offload", D.choices.offload, LABELS.offload)));
    form.appendChild(main);
    var more = el("details", { "class": "vramlab-calc__more" });
    more.open = !compact;
    more.appendChild(el("summary", {}, "更多选项"));
    var grid = el("div", { "class": "vramlab-calc__grid" });
    grid.appendChild(field("注意力实现", select("attention", D.choices.attention, LABELS.attention)));
    grid.appendChild(field("dropout", number("dropout", 0, "0.05")));
    grid.appendChild(field("梯度累积步数", number("accum", 1)));
    grid.appendChild(field("QLoRA（基座线性层用 NF4）", checkbox("qlora")));
    grid.appendChild(field("foreach 实现（AdamW、Adafactor；AdamW 在 GPU 上默认）", checkbox("foreach")));
    grid.appendChild(field("只做推理（前向）", checkbox("inference")));
    more.appendChild(grid);
    form.appendChild(more);
    if (compact) root.classList.add("vramlab-calc--compact");
    return form;
  }

  function setValues(form, w, qlora) {
    Object.keys(w).forEach(function (k) {
      var c = form.elements[k];
      if (!c) return;
      if (c.type === "checkbox") c.checked = !!w[k]; else c.value = String(w[k]);
    });
    form.elements.qlora.checked = !!qlora;
  }

  function readValues(form) {
    var f = form.elements, num = function (k) { return Number(f[k].value); };
    return { model: f.model.value, precision: f.precision.value, optimizer: f.optimizer.value,
      batch: num("batch"), seq: num("seq"), checkpointing: f.checkpointing.value, attention: f.attention.value,
      dropout: num("dropout"), lora_rank: num("lora_rank"), zero: num("zero"), gpus: num("gpus"),
      accum: num("accum"), offload: f.offload.value, foreach: f.foreach.checked, inference: f.inference.checked,
      lora_targets: f.lora_targets.value, qlora: f.qlora.checked };
  }

  function initial(root) {
    var w = E.workload({}), qlora = false;
    Array.prototype.forEach.call(root.attributes, function (a) {
      if (a.name.indexOf("data-w-") !== 0) return;
      var k = a.name.slice(7).replace(/-/g, "_"), v = a.value;
      if (k === "qlora") { qlora = v === "true"; return; }
      if (!(k in w)) return;
      w[k] = typeof w[k] === "number" ? Number(v) : typeof w[k] === "boolean" ? v === "true" : v;
    });
    return { w: w, qlora: qlora };
  }

  function render(out, est) {
    out.innerHTML = "";
    var total = est.total_bytes;
    var head = el("p", { "class": "vramlab-calc__total" });
    head.appendChild(el("strong", {}, "估算峰值显存（单卡）：" + fmtBytes(total)));
    head.appendChild(document.createTextNode("（" + group(total) + " 字节；峰值时刻：" + D.phase_zh[est.peak_phase] + "）"));
    out.appendChild(head);

    // 堆叠条：一眼看出谁占大头
    var stack = el("div", { "class": "vramlab-calc__stack", role: "img", "aria-label": "显存构成堆叠条形图" });
    D.keys.forEach(function (k) {
      var b = est.breakdown[k];
      if (b <= 0) return;
      var seg = el("span", { "data-key": k, title: D.category_zh[k] + "：" + fmtBytes(b) });
      seg.style.width = (100 * b / total) + "%";
      seg.style.background = COLORS[k];
      stack.appendChild(seg);
    });
    out.appendChild(stack);

    // 每个类别一行：名字、条、数值
    var max = Math.max.apply(null, D.keys.map(function (k) { return est.breakdown[k]; }));
    var rows = el("div", { "class": "vramlab-calc__bars" });
    D.keys.forEach(function (k) {
      var b = est.breakdown[k];
      var row = el("div", { "class": "vramlab-calc__bar", "data-key": k, "data-bytes": String(b) });
      row.appendChild(el("span", { "class": "vramlab-calc__name" }, D.category_zh[k]));
      var track = el("span", { "class": "vramlab-calc__track" });
      var fill = el("span", { "class": "vramlab-calc__fill" });
      fill.style.width = (max ? 100 * b / max : 0) + "%";
      fill.style.background = COLORS[k];
      track.appendChild(fill);
      row.appendChild(track);
      row.appendChild(el("span", { "class": "vramlab-calc__value" },
        fmtBytes(b) + "（" + (total ? (100 * b / total).toFixed(1) : "0.0") + "%）"));
      rows.appendChild(row);
    });
    out.appendChild(rows);

    var cards = el("ul", { "class": "vramlab-calc__cards" });
    D.cards_gb.forEach(function (gb) {
      var v = E.fitVerdict(total, gb);
      var li = el("li", { "data-card-gb": String(gb), "data-verdict": v, "class": "vramlab-calc__card--" + v });
      li.appendChild(el("span", { "class": "vramlab-calc__badge" }, VERDICT[v]));
      li.appendChild(document.createTextNode(gb + " GB 显卡（" + (gb * 1e9 / GiB).toFixed(1) + " GiB），占用 " +
        (100 * total / (gb * 1e9)).toFixed(0) + "%"));
      cards.appendChild(li);
    });
    out.appendChild(cards);
    var n = el("p", { "class": "vramlab-calc__note" });
    n.textContent = "参数 " + group(est.params) + " 个，可训练 " + group(est.trainable_params) + " 个。" +
      "显卡容量按厂商标称的十进制 GB 计（1 GB = 10^9 字节）；" +
      "“偏紧”表示估算值放得下，但加上约 " + Math.round(D.context_reserve_bytes / MiB) +
      " MiB 的 CUDA 上下文就不够了。估算的是 max_memory_allocated，不含缓存分配器多保留的部分。";
    out.appendChild(n);
  }

  function setup(root) {
    var form = buildForm(root), out = el("div", { "class": "vramlab-calc__out", "aria-live": "polite" });
    root.innerHTML = "";
    root.appendChild(form);
    root.appendChild(out);
    var init = initial(root);
    setValues(form, init.w, init.qlora);
    function update() {
      var fields = readValues(form), est;
      try {
        est = E.estimate(fields, form.elements.qlora.checked);
      } catch (e) {
        if (!(e instanceof E.WorkloadError)) throw e;
        out.innerHTML = "";
        out.appendChild(el("p", { "class": "vramlab-calc__error", role: "alert" }, "无法估算：" + e.message));
        root.removeAttribute("data-total-bytes");
        root.setAttribute("data-error", e.message);
        return;
      }
      root.removeAttribute("data-error");
      root.setAttribute("data-total-bytes", String(est.total_bytes));
      render(out, est);
    }
    form.addEventListener("input", update);
    form.addEventListener("change", update);
    form.addEventListener("submit", function (e) { e.preventDefault(); });
    root.vramlabUpdate = update;
    update();
  }

  function start() { Array.prototype.forEach.call(document.querySelectorAll(".vramlab-calc"), setup); }
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start); else start();
})();
