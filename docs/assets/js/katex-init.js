/* 用仓库内的 KaTeX 渲染公式 (不走 CDN)。
 * Markdown 页面: pymdownx.arithmatex (generic) 输出 .arithmatex 元素, 内容用 \( \) 和 \[ \] 包裹。
 * Notebook 页面: mkdocs-jupyter 保留 $...$ / $$...$$, 只在 .jupyter-wrapper 里识别美元符号,
 * 以免正文里的 shell 提示符 "$" 被当成公式。
 * Material 每次加载页面 (包括即时导航) 都会通过 document$ 发出新文档。 */
(function () {
  "use strict";
  var TEX_DELIMS = [
    { left: "\\[", right: "\\]", display: true },
    { left: "\\(", right: "\\)", display: false }
  ];
  var NOTEBOOK_DELIMS = [
    { left: "$$", right: "$$", display: true },
    { left: "$", right: "$", display: false }
  ].concat(TEX_DELIMS);

  function render(root) {
    if (typeof renderMathInElement !== "function") return;
    var opts = { throwOnError: false, strict: "ignore" };
    root.querySelectorAll(".arithmatex").forEach(function (el) {
      renderMathInElement(el, Object.assign({ delimiters: TEX_DELIMS }, opts));
    });
    root.querySelectorAll(".jupyter-wrapper .jp-RenderedMarkdown, .jupyter-wrapper .jp-RenderedLatex")
      .forEach(function (el) {
        renderMathInElement(el, Object.assign({ delimiters: NOTEBOOK_DELIMS }, opts));
      });
  }

  if (typeof document$ !== "undefined" && document$.subscribe) {
    document$.subscribe(function (doc) { render(doc.body || document.body); });
  } else {
    document.addEventListener("DOMContentLoaded", function () { render(document.body); });
  }
})();
