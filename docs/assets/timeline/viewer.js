/* 显存时间线查看器：把 vramlab 的时间线 JSON（vramlab/trace/format.py）画成按类别堆叠的阶梯图。
 *
 * 页面里的 <div class="vramlab-timeline" data-traces="[...]"> 由 docs/hooks/timeline.py 生成。
 * 站内的示例时间线以 <script> 方式加载（assets/traces/<name>.js，构建时由同名 JSON 包装而来），
 * 因为浏览器不允许在 file:// 下用 fetch 读文件；读者自己的文件用 FileReader 读取。不依赖任何外部库。
 */
(function () {
  "use strict";
  var SVGNS = "http://www.w3.org/2000/svg";
  var MiB = 1024 * 1024, GiB = 1024 * MiB;
  var COLORS = { parameters: "#3f51b5", gradients: "#e91e63", optimizer_state: "#ff9800", activations: "#4caf50",
    temporaries: "#00acc1", cuda_overhead: "#757575", other: "#bdbdbd", unknown: "#8d6e63", before_trace: "#cfd8dc" };
  var EXTRA = ["#795548", "#607d8b", "#cddc39", "#673ab7"];
  var script = document.currentScript;
  var tracesBase = script ? script.src.replace(/timeline\/viewer\.js(\?.*)?$/, "traces/") : "";
  var pending = {};    // name -> callbacks waiting for assets/traces/<name>.js

  // assets/traces/<name>.js 调用它
  window.vramlabTraceLoaded = function (name, trace) {
    (pending[name] || []).forEach(function (cb) { cb(null, trace); });
    delete pending[name];
  };

  function loadSiteTrace(name, cb) {
    if (pending[name]) { pending[name].push(cb); return; }
    pending[name] = [cb];
    var s = document.createElement("script");
    s.src = tracesBase + encodeURIComponent(name) + ".js";
    s.onerror = function () {
      (pending[name] || []).forEach(function (f) { f(new Error("无法加载时间线 " + name)); });
      delete pending[name];
    };
    document.head.appendChild(s);
  }

  function fmtBytes(n) {
    var a = Math.abs(n);
    if (a >= GiB) return (n / GiB).toFixed(2) + " GiB";
    if (a >= MiB) return (n / MiB).toFixed(1) + " MiB";
    if (a >= 1024) return (n / 1024).toFixed(1) + " KiB";
    return n + " B";
  }
  function el(tag, attrs, text) {
    var e = document.createElement(tag);
    for (var k in attrs || {}) e.setAttribute(k, attrs[k]);
    if (text !== undefined) e.textContent = text;
    return e;
  }
  function svg(tag, attrs) {
    var e = document.createElementNS(SVGNS, tag);
    for (var k in attrs || {}) e.setAttribute(k, attrs[k]);
    return e;
  }

  function checkTrace(t) {      // format.check_trace 的浏览器版（只查查看器要用的部分）
    if (!t || t.format !== "vramlab-trace" || t.version !== 1)
      throw new Error("不是 vramlab 时间线文件：需要 format 为 vramlab-trace、version 为 1 的 JSON（用 vramlab trace 导出）");
    var p = t.points;
    if (!p || !Array.isArray(p.x) || !Array.isArray(p.allocated) || p.x.length !== p.allocated.length)
      throw new Error("时间线文件缺少 points.x / points.allocated，或两者长度不同");
    (t.categories || []).forEach(function (c) {
      if (!p.by_category[c] || p.by_category[c].length !== p.x.length) throw new Error("类别 " + c + " 的点数不对");
    });
    return t;
  }

  function niceStep(max, ticks) {
    var raw = max / ticks, mag = Math.pow(10, Math.floor(Math.log10(raw))), n = raw / mag;
    return (n <= 1 ? 1 : n <= 2 ? 2 : n <= 5 ? 5 : 10) * mag;
  }

  function Viewer(root) {
    this.root = root;
    this.list = JSON.parse(root.getAttribute("data-traces") || "[]");
    this.trace = null;
    this.view = null;
    this.build();
  }

  Viewer.prototype.build = function () {
    var self = this, root = this.root;
    root.innerHTML = "";
    var bar = el("div", { "class": "vramlab-timeline__toolbar" });
    var pick = el("label", {}, "示例：");
    this.select = el("select", { name: "trace" });
    this.list.forEach(function (t) { self.select.appendChild(el("option", { value: t.name }, t.title)); });
    pick.appendChild(this.select);
    bar.appendChild(pick);
    var fileLabel = el("label", { "class": "vramlab-timeline__file" }, "打开文件：");
    this.file = el("input", { type: "file", accept: ".json,application/json", name: "trace-file" });
    fileLabel.appendChild(this.file);
    bar.appendChild(fileLabel);
    [["放大", 0.5], ["缩小", 2], ["重置缩放", 0]].forEach(function (b) {
      var btn = el("button", { type: "button", "class": "md-button vramlab-timeline__zoom", "data-zoom": String(b[1]) }, b[0]);
      btn.addEventListener("click", function () { self.zoom(b[1]); });
      bar.appendChild(btn);
    });
    this.download = el("a", { "class": "vramlab-timeline__download", download: "" }, "下载 JSON");
    bar.appendChild(this.download);
    root.appendChild(bar);
    this.status = el("p", { "class": "vramlab-timeline__status", role: "status" });
    root.appendChild(this.status);
    this.head = el("div", { "class": "vramlab-timeline__head" });
    root.appendChild(this.head);
    this.peak = el("p", { "class": "vramlab-timeline__peak" });
    root.appendChild(this.peak);
    this.chartBox = el("div", { "class": "vramlab-timeline__chart" });
    root.appendChild(this.chartBox);
    this.tip = el("div", { "class": "vramlab-timeline__tip", hidden: "" });
    this.chartBox.appendChild(this.tip);
    this.legend = el("ul", { "class": "vramlab-timeline__legend" });
    root.appendChild(this.legend);
    root.appendChild(el("p", { "class": "vramlab-timeline__hint" },
      "在图上左右拖动（鼠标或手指）框选一段放大，“重置缩放”回到全图；鼠标悬停或手指轻点查看那一点的分配情况。" +
      "也可以把 JSON 文件拖到这里。"));

    this.select.addEventListener("change", function () { self.loadSite(self.select.value); });
    this.file.addEventListener("change", function () { if (self.file.files[0]) self.loadFile(self.file.files[0]); });
    root.addEventListener("dragover", function (e) { e.preventDefault(); root.classList.add("is-dragging"); });
    root.addEventListener("dragleave", function () { root.classList.remove("is-dragging"); });
    root.addEventListener("drop", function (e) {
      e.preventDefault();
      root.classList.remove("is-dragging");
      if (e.dataTransfer && e.dataTransfer.files[0]) self.loadFile(e.dataTransfer.files[0]);
    });
    this.bindPointer();
    // 容器变宽变窄（转屏、侧栏收起）时按新宽度重画；只看宽度，重画改变的高度不会再触发
    var redraw = function () {      // 下一帧再画：不在 ResizeObserver 的回调里改布局
      window.requestAnimationFrame(function () {
        if (self.trace && Math.round(self.chartBox.clientWidth) !== self.drawnWidth) self.draw();
      });
    };
    if (window.ResizeObserver) new ResizeObserver(redraw).observe(this.chartBox);
    else window.addEventListener("resize", redraw);
    if (this.list.length) this.loadSite(this.list[0].name);
  };

  Viewer.prototype.error = function (msg) {
    this.status.textContent = msg;
    this.status.classList.add("is-error");
    this.root.setAttribute("data-error", msg);
  };

  Viewer.prototype.loadSite = function (name) {
    var self = this;
    this.status.textContent = "正在加载……";
    loadSiteTrace(name, function (err, trace) {
      if (err) return self.error(err.message);
      self.download.setAttribute("href", tracesBase + name + ".json");
      self.download.hidden = false;
      self.show(trace, name);
    });
  };

  Viewer.prototype.loadFile = function (file) {
    var self = this, reader = new FileReader();
    reader.onload = function () {
      var t;
      try { t = checkTrace(JSON.parse(reader.result)); }
      catch (e) { return self.error("无法打开 " + file.name + "：" + (e instanceof SyntaxError ? "不是有效的 JSON" : e.message)); }
      self.download.hidden = true;
      self.show(t, "file:" + file.name);
    };
    reader.onerror = function () { self.error("读取文件失败：" + file.name); };
    reader.readAsText(file);
  };

  Viewer.prototype.show = function (trace, name) {
    try { checkTrace(trace); } catch (e) { return this.error(e.message); }
    this.trace = trace;
    var xs = trace.points.x;
    this.view = [xs[0], xs[xs.length - 1]];
    this.status.textContent = "";
    this.status.classList.remove("is-error");
    this.root.removeAttribute("data-error");
    this.root.setAttribute("data-trace", name);
    this.head.innerHTML = "";
    this.head.appendChild(el("h3", {}, trace.title || "显存时间线"));
    if (trace.description) this.head.appendChild(el("p", {}, trace.description));
    var s = trace.source || {};
    var bits = [s.device, s.torch ? "PyTorch " + s.torch : "", s.date ? "记录于 " + s.date : "", s.measure];
    this.head.appendChild(el("p", { "class": "vramlab-timeline__source" }, bits.filter(Boolean).join("；")));
    var pk = trace.peak;
    this.peak.innerHTML = "";
    this.peak.setAttribute("data-op", pk.op);
    this.peak.setAttribute("data-module", pk.module);
    this.peak.setAttribute("data-bytes", String(pk.bytes));
    this.peak.appendChild(el("strong", {}, "峰值 " + fmtBytes(pk.bytes) + "（已分配）"));
    this.peak.appendChild(document.createTextNode("，出现在第 " + pk.x + " 个事件：算子 "));
    this.peak.appendChild(el("code", { "class": "vramlab-timeline__op" }, pk.op));
    this.peak.appendChild(document.createTextNode("，模块 "));
    this.peak.appendChild(el("code", { "class": "vramlab-timeline__module" }, pk.module));
    this.peak.appendChild(document.createTextNode(pk.reserved != null ? "；此时已保留 " + fmtBytes(pk.reserved) + "。" : "。"));
    this.legend.innerHTML = "";
    var self = this;
    trace.categories.forEach(function (c, i) {
      var li = el("li", { "data-key": c });
      var sw = el("span", { "class": "vramlab-timeline__swatch" });
      sw.style.background = self.color(c, i);
      li.appendChild(sw);
      li.appendChild(document.createTextNode((trace.category_zh || {})[c] || c));
      li.appendChild(el("span", { "class": "vramlab-timeline__legend-value" }, "峰值时 " + fmtBytes((pk.breakdown || {})[c] || 0)));
      self.legend.appendChild(li);
    });
    if (trace.points.reserved) {
      var li = el("li", { "data-key": "reserved" });
      li.appendChild(el("span", { "class": "vramlab-timeline__swatch vramlab-timeline__swatch--line" }));
      li.appendChild(document.createTextNode("已保留显存（虚线）"));
      this.legend.appendChild(li);
    }
    this.draw();
  };

  Viewer.prototype.color = function (c, i) { return COLORS[c] || EXTRA[i % EXTRA.length]; };

  Viewer.prototype.zoom = function (factor) {
    if (!this.trace) return;
    var xs = this.trace.points.x, lo = xs[0], hi = xs[xs.length - 1];
    if (!factor) { this.view = [lo, hi]; return this.draw(); }
    var mid = (this.view[0] + this.view[1]) / 2, half = Math.max(2, (this.view[1] - this.view[0]) * factor / 2);
    this.view = [Math.max(lo, Math.round(mid - half)), Math.min(hi, Math.round(mid + half))];
    this.draw();
  };

  // 文字宽度：能量就量（元素已在页面里），量不到（例如查看器在隐藏的标签页里）就按字数估
  function textWidth(node, size) {
    var w = 0;
    try { w = node.getComputedTextLength(); } catch (e) { w = 0; }
    if (w) return w;
    var s = node.textContent || "", n = 0;
    for (var i = 0; i < s.length; i++) n += s.charCodeAt(i) > 0x2e80 ? 1 : 0.6;
    return n * size;
  }

  Viewer.prototype.draw = function () {
    var t = this.trace, p = t.points, self = this;
    // 按容器的实际宽度画，不设最小宽度：窄屏上图不会把页面撑宽
    var W = Math.max(200, Math.round(this.chartBox.clientWidth || 640)), narrow = W < 480;
    var H = narrow ? 280 : 320;
    var m = { l: narrow ? 40 : 56, r: 10, t: 26, b: 40 }, iw = W - m.l - m.r, ih = H - m.t - m.b;
    var x0 = this.view[0], x1 = Math.max(this.view[1], x0 + 1);
    this.drawnWidth = W;
    // 视野里的点，再各带一个邻点，让阶梯从左边缘开始、到右边缘结束
    var idx = [];
    for (var i = 0; i < p.x.length; i++) {
      if (p.x[i] >= x0 && p.x[i] <= x1) idx.push(i);
      else if (p.x[i] < x0 && (i + 1 >= p.x.length || p.x[i + 1] >= x0)) idx.push(i);
      else if (p.x[i] > x1) { idx.push(i); break; }
    }
    var ymax = 1;
    idx.forEach(function (i) {
      ymax = Math.max(ymax, p.allocated[i], p.reserved && p.reserved[i] != null ? p.reserved[i] : 0);
    });
    var unit = ymax >= 4 * GiB ? GiB : MiB, uname = unit === GiB ? "GiB" : "MiB";
    var step = niceStep(ymax / unit, narrow ? 4 : 5) * unit, ytop = Math.ceil(ymax / step) * step;
    var sx = function (x) { return m.l + (Math.min(Math.max(x, x0), x1) - x0) / (x1 - x0) * iw; };
    var sy = function (y) { return m.t + ih - y / ytop * ih; };

    var old = this.chartBox.querySelector("svg");
    if (old) old.remove();
    var g = svg("svg", { width: W, height: H, viewBox: "0 0 " + W + " " + H, role: "img",
      "aria-label": "显存时间线：按类别堆叠的已分配显存" });
    // 先放进页面，下面的文字才量得出宽度（用来剔除会互相重叠的标签）
    this.chartBox.insertBefore(g, this.tip);
    for (var y = 0; y <= ytop + 1; y += step) {
      g.appendChild(svg("line", { x1: m.l, x2: W - m.r, y1: sy(y), y2: sy(y), "class": "grid" }));
      var lab = svg("text", { x: m.l - 5, y: sy(y) + 4, "text-anchor": "end", "class": "tick" });
      lab.textContent = (y / unit).toFixed(step / unit < 1 ? 1 : 0);
      g.appendChild(lab);
    }
    var yl = svg("text", { x: 2, y: 11, "class": "axis" }); yl.textContent = "显存（" + uname + "）"; g.appendChild(yl);
    var xl = svg("text", { x: W - m.r, y: H - 4, "text-anchor": "end", "class": "axis" });
    xl.textContent = t.x_label || "事件序号"; g.appendChild(xl);
    // 横轴刻度取整齐的数，间距按宽度定；会与前一个重叠或出界的刻度不画
    var xstep = Math.max(1, niceStep(x1 - x0, Math.max(1, Math.floor(iw / 90))));
    var lastRight = -Infinity;
    for (var k0 = Math.ceil(x0 / xstep); k0 * xstep <= x1; k0++) {
      var xv = k0 * xstep, tx = svg("text", { y: H - m.b + 15, "text-anchor": "middle", "class": "tick" });
      tx.textContent = String(xv);
      g.appendChild(tx);
      var tw = textWidth(tx, 11), left = Math.min(Math.max(sx(xv) - tw / 2, 0), W - tw);
      if (left < lastRight + 8) { tx.remove(); continue; }
      tx.setAttribute("x", (left + tw / 2).toFixed(1));
      g.appendChild(svg("line", { x1: sx(xv), x2: sx(xv), y1: m.t + ih, y2: m.t + ih + 4, "class": "grid" }));
      lastRight = left + tw;
    }

    // 堆叠阶梯：逐类别累加，每一类画成上沿与下沿之间的多边形
    var base = idx.map(function () { return 0; });
    t.categories.forEach(function (c, ci) {
      var top = idx.map(function (i, k) { return base[k] + p.by_category[c][i]; });
      var d = "", k, xa, xb;
      for (k = 0; k < idx.length; k++) {
        xa = sx(p.x[idx[k]]); xb = k + 1 < idx.length ? sx(p.x[idx[k + 1]]) : sx(x1);
        d += (k ? "L" : "M") + xa.toFixed(1) + "," + sy(top[k]).toFixed(1) + "L" + xb.toFixed(1) + "," + sy(top[k]).toFixed(1);
      }
      for (k = idx.length - 1; k >= 0; k--) {
        xa = sx(p.x[idx[k]]); xb = k + 1 < idx.length ? sx(p.x[idx[k + 1]]) : sx(x1);
        d += "L" + xb.toFixed(1) + "," + sy(base[k]).toFixed(1) + "L" + xa.toFixed(1) + "," + sy(base[k]).toFixed(1);
      }
      g.appendChild(svg("path", { d: d + "Z", fill: self.color(c, ci), "data-key": c, "class": "area" }));
      base = top;
    });
    if (p.reserved) {
      var r = "";
      idx.forEach(function (i, k) {
        if (p.reserved[i] == null) return;
        var xb = k + 1 < idx.length ? sx(p.x[idx[k + 1]]) : sx(x1);
        r += (r ? "L" : "M") + sx(p.x[i]).toFixed(1) + "," + sy(p.reserved[i]).toFixed(1) + "L" + xb.toFixed(1) + "," + sy(p.reserved[i]).toFixed(1);
      });
      g.appendChild(svg("path", { d: r, "class": "reserved", "data-key": "reserved" }));
    }
    // 标签分三行错开（按量出的宽度）；三行都挤不下、或会出右边界的只画线（悬停看 title）
    var rowEnd = [-1e9, -1e9, -1e9];
    (t.marks || []).forEach(function (mk) {
      if (mk.x < x0 || mk.x > x1) return;
      var line = svg("line", { x1: sx(mk.x), x2: sx(mk.x), y1: m.t, y2: m.t + ih, "class": "mark" });
      var title = svg("title"); title.textContent = mk.label; line.appendChild(title);
      g.appendChild(line);
      var row = rowEnd.findIndex(function (end) { return sx(mk.x) > end + 4; });
      if (row < 0) return;
      var tx = svg("text", { x: sx(mk.x) + 3, y: m.t + 10 + 11 * row, "class": "mark-label" });
      tx.textContent = mk.label; g.appendChild(tx);
      var right = sx(mk.x) + 3 + textWidth(tx, 10);
      if (right > W - m.r) { tx.remove(); return; }
      rowEnd[row] = right;
    });
    var pk = t.peak;
    if (pk.x >= x0 && pk.x <= x1) {
      var px = sx(pk.x), py = sy(pk.bytes);
      g.appendChild(svg("line", { x1: px, x2: px, y1: py, y2: m.t + ih, "class": "peak-line" }));
      g.appendChild(svg("circle", { cx: px, cy: py, r: 4, "class": "peak-dot", "data-peak": "" }));
      // 标签留在绘图区里（不压住纵轴刻度），放在三行阶段标签的下面；默认放在离边更远的一侧
      var roomL = px - 6 - m.l - 2, roomR = W - m.r - (px + 6);
      var pt = svg("text", { y: Math.max(m.t + 48, py - 6), "class": "peak-label" });
      var head = svg("tspan", { "class": "peak-head" });
      head.textContent = "峰值 " + fmtBytes(pk.bytes);
      var opLine = svg("tspan", { dy: "1.2em", "class": "peak-op" });
      opLine.textContent = pk.op;
      pt.appendChild(head);
      pt.appendChild(opLine);
      var ptTitle = svg("title"); ptTitle.textContent = pk.op + " @ " + pk.module; pt.appendChild(ptTitle);
      g.appendChild(pt);
      var hw = textWidth(head, 11), toLeft = roomL > roomR;
      if (hw > (toLeft ? roomL : roomR) && hw <= (toLeft ? roomR : roomL)) toLeft = !toLeft;
      var ax = toLeft ? px - 6 : px + 6, room = toLeft ? roomL : roomR;
      pt.setAttribute("x", ax);
      pt.setAttribute("text-anchor", toLeft ? "end" : "start");
      head.setAttribute("x", ax);
      opLine.setAttribute("x", ax);
      // 算子名太长就截短（完整名字在上面的说明和 title 里）；一个字也放不下就不画
      var ow = textWidth(opLine, 11);
      if (ow > room) {
        var keep = Math.floor(pk.op.length * room / ow) - 1;
        if (keep >= 3) opLine.textContent = pk.op.slice(0, keep) + "…"; else pt.removeChild(opLine);
      }
    }
    var sel = svg("rect", { x: 0, y: m.t, width: 0, height: ih, "class": "selection", visibility: "hidden" });
    g.appendChild(sel);
    g.appendChild(svg("rect", { x: m.l, y: m.t, width: iw, height: ih, fill: "transparent", "class": "overlay" }));
    this.svgEl = g;
    this.selEl = sel;
    this.geo = { W: W, H: H, m: m, iw: iw, ih: ih, x0: x0, x1: x1 };
    var xs = p.x;
    this.root.setAttribute("data-view", x0 + "-" + x1);
    this.root.classList.toggle("is-zoomed", x0 > xs[0] || x1 < xs[xs.length - 1]);
  };

  Viewer.prototype.pointAt = function (x) {   // 最后一个 points.x <= x 的点
    var xs = this.trace.points.x, lo = 0, hi = xs.length - 1;
    while (lo < hi) { var mid = (lo + hi + 1) >> 1; if (xs[mid] <= x) lo = mid; else hi = mid - 1; }
    return lo;
  };

  var DRAG_PX = 6;        // 按下后移动不到这么多（CSS 像素）算点击/轻点，否则算拖动框选

  // 鼠标、触屏、触控笔都走 Pointer Events，监听器只在 build() 里绑一次（挂在不会重画的 chartBox 上）：
  // 按下时捕获指针，抬起（或取消）时必定收尾，所以点一下之后再拖也照样能放大。
  Viewer.prototype.bindPointer = function () {
    var self = this, box = this.chartBox, drag = null;
    function at(e) {           // 指针在图里的坐标（viewBox 单位）和在 chartBox 里的 CSS 像素坐标
      var r = self.svgEl.getBoundingClientRect(), b = box.getBoundingClientRect(), geo = self.geo;
      return { px: (e.clientX - r.left) * geo.W / (r.width || geo.W), py: (e.clientY - r.top) * geo.H / (r.height || geo.H),
        cx: e.clientX - b.left, cy: e.clientY - b.top };
    }
    function inPlot(q) {
      var geo = self.geo;
      return q.px >= geo.m.l - 2 && q.px <= geo.m.l + geo.iw + 2 && q.py >= geo.m.t && q.py <= geo.m.t + geo.ih;
    }
    function toX(px) {
      var geo = self.geo, c = Math.min(Math.max(px, geo.m.l), geo.m.l + geo.iw);
      return geo.x0 + (c - geo.m.l) / geo.iw * (geo.x1 - geo.x0);
    }
    function band(a, b) {
      var sel = self.selEl;
      if (a == null) { sel.setAttribute("visibility", "hidden"); return; }
      var geo = self.geo, lo = Math.max(geo.m.l, Math.min(a, b)), hi = Math.min(geo.m.l + geo.iw, Math.max(a, b));
      sel.setAttribute("x", lo);
      sel.setAttribute("width", Math.max(0, hi - lo));
      sel.setAttribute("visibility", "visible");
    }
    function end() { drag = null; if (self.selEl) band(null); }

    box.addEventListener("pointerdown", function (e) {
      if (!self.trace || !self.svgEl || !e.isPrimary || (e.pointerType === "mouse" && e.button !== 0)) return;
      var q = at(e);
      if (!inPlot(q)) return;
      drag = { id: e.pointerId, px: q.px, moved: false };
      try { box.setPointerCapture(e.pointerId); } catch (err) { /* 没有捕获也能用：抬起在图外时由 pointercancel/lost 收尾 */ }
      if (e.pointerType === "mouse") e.preventDefault();          // 拖动时不选中页面文字
    });
    box.addEventListener("pointermove", function (e) {
      if (!self.svgEl) return;
      var q = at(e);
      if (drag && e.pointerId === drag.id) {
        if (Math.abs(q.px - drag.px) >= DRAG_PX) drag.moved = true;
        if (drag.moved) { band(drag.px, q.px); if (e.pointerType !== "mouse") self.tip.hidden = true; }
        if (e.pointerType === "mouse") self.tooltip(toX(q.px), q.cx, q.cy, e.pointerType);
        return;
      }
      if (e.pointerType !== "mouse") return;                       // 触屏没有悬停：轻点才显示
      if (inPlot(q)) self.tooltip(toX(q.px), q.cx, q.cy, e.pointerType); else self.tip.hidden = true;
    });
    box.addEventListener("pointerup", function (e) {
      if (!drag || e.pointerId !== drag.id) return;
      var d = drag, q = at(e);
      end();
      if (d.moved) {
        var a = toX(d.px), b = toX(q.px), lo = Math.floor(Math.min(a, b)), hi = Math.ceil(Math.max(a, b));
        if (hi - lo >= 1) { self.view = [lo, hi]; self.tip.hidden = true; self.draw(); return; }
      }
      self.tooltip(toX(q.px), q.cx, q.cy, e.pointerType);         // 点击或轻点：显示这一点
    });
    box.addEventListener("pointercancel", function (e) { if (drag && e.pointerId === drag.id) end(); });
    box.addEventListener("lostpointercapture", function (e) { if (drag && e.pointerId === drag.id) end(); });
    box.addEventListener("pointerleave", function (e) { if (e.pointerType === "mouse" && !drag) self.tip.hidden = true; });
    // 触屏上点到图外，收起提示框
    document.addEventListener("pointerdown", function (e) {
      if (e.pointerType !== "mouse" && !box.contains(e.target)) self.tip.hidden = true;
    });
  };

  Viewer.prototype.tooltip = function (x, cx, cy, pointerType) {
    var t = this.trace, p = t.points, i = this.pointAt(x), tip = this.tip;
    tip.innerHTML = "";
    tip.setAttribute("data-x", String(p.x[i]));
    tip.appendChild(el("strong", {}, "事件 " + p.x[i] + "：" + fmtBytes(p.allocated[i]) + " 已分配"));
    if (p.reserved && p.reserved[i] != null) tip.appendChild(el("div", {}, "已保留 " + fmtBytes(p.reserved[i])));
    if (t.labels && p.label) tip.appendChild(el("code", {}, t.labels[p.label[i]]));
    var ul = el("ul");
    t.categories.forEach(function (c) {
      var v = p.by_category[c][i];
      if (v) ul.appendChild(el("li", {}, ((t.category_zh || {})[c] || c) + "：" + fmtBytes(v)));
    });
    tip.appendChild(ul);
    tip.hidden = false;
    // 放在图框之内：右半边放在指针左侧；触屏时放到手指上方，不被手指挡住
    var w = this.chartBox.clientWidth, tw = tip.offsetWidth, th = tip.offsetHeight;
    var left = cx + 12 + tw <= w ? cx + 12 : cx - 12 - tw;
    tip.style.left = Math.max(0, Math.min(left, w - tw)) + "px";
    var top = pointerType && pointerType !== "mouse" ? cy - th - 24 : cy - 10;
    tip.style.top = Math.max(0, top) + "px";
  };

  function start() {
    Array.prototype.forEach.call(document.querySelectorAll(".vramlab-timeline"), function (root) {
      root.vramlabViewer = new Viewer(root);
    });
  }
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start); else start();
})();
