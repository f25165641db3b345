/* 搜索查询的分词：和索引用同一套词。
 *
 * Built into the site's search worker by docs/hooks/search_query.py: this file, then Material's
 * own worker (search.<hash>.min.js), then a line calling vramlabSearch.patchLunr(self.lunr).
 * Not loaded by any page on its own.
 *
 * Why: the index is cut with jieba and the course's user dictionary (梯度检查点 is one token),
 * but Material's worker re-cuts each Han run of the query greedily against the index and never
 * matches the run's last character (material/.../search/query/segment), so 梯度检查点 became
 * "梯度* 检查*" and found 梯度压缩 first. Here, before Material sees a query:
 *   - each Han run is cut into the fewest words of the index's own vocabulary (the inverted
 *     index: every token jieba produced at build time), unknown characters one by one;
 *   - non-Han text is split with the index's separator, as the index was;
 *   - every plain word w becomes "w^EXACT w": Material adds "*" to the second (prefix matches:
 *     ZeRO also finds zero_grad), the first ranks whole-word matches above prefix ones;
 *   - an English name from the glossary (docs/terms.md, "KV cache") also searches its Chinese
 *     term ("键值缓存"), as a whole word, when that term is one word of the index.
 * Material's own cutting is switched off by hiding the vocabulary from its `value in index`
 * test (a Proxy on lunr's inverted index whose `has` is always false): a Han run it sees is
 * then kept whole. Everything else (lunr, ranking by field boosts, highlighting) is Material's.
 * One lunr bug is mended here too (patchLunr, TokenSet.toString): its token set must hold
 * exactly the words of the inverted index (scripts/search_worker_check.js, run by tests/test_search_browser.py, checks the built site).
 *
 * Works the same in a Web Worker and in the iframe-worker shim (file://): both dispatch message
 * events to listeners in the order they were added, and this listener is added first.
 */
var vramlabSearch = (function () {
  "use strict";

  var EXACT = 10;            // query-vector weight of a whole word, against 1 for a prefix match
  var LONGEST = 16;          // longest Han word looked up
  var HAN = /\p{Script=Han}+/u;
  var HAN_RUNS = /(\p{Script=Han}+)/u;
  var SYNTAX = /^[+-]|[*~^:"]/;   // lunr query syntax typed by the reader: left as it is

  var words = null;          // lunr's inverted index (term -> postings), once built
  var separator = /[\s\-]+/; // replaced by the index's own separator at setup

  function known(word) {
    return words !== null && Object.prototype.hasOwnProperty.call(words, word);
  }

  /* Fewest words that spell `run`; a character the index lacks is a word of its own and
   * counts double, so known words win ties. */
  function cut(run) {
    var n = run.length, cost = [0], from = [0];
    for (var j = 1; j <= n; j++) {
      cost[j] = cost[j - 1] + (known(run[j - 1]) ? 1 : 2);
      from[j] = j - 1;
      for (var i = Math.max(0, j - LONGEST); i < j - 1; i++) {
        if (cost[i] + 1 < cost[j] && known(run.slice(i, j))) {
          cost[j] = cost[i] + 1;
          from[j] = i;
        }
      }
    }
    var out = [];
    for (var k = n; k > 0; k = from[k]) out.unshift(run.slice(from[k], k));
    return out;
  }

  /* The query's words, cut like the index's text. */
  function terms(text) {
    var out = [];
    text.split(HAN_RUNS).forEach(function (piece) {
      if (!piece) return;
      if (HAN.test(piece)) out.push.apply(out, cut(piece));
      else piece.split(separator).forEach(function (t) { if (t) out.push(t); });
    });
    return out;
  }

  /* The glossary's Chinese terms for English names in the query (docs/terms.md, given by the hook
   * as vramlabSynonyms: "kv cache" -> ["键值缓存"]), only those that are words of the index. */
  var synonyms = typeof vramlabSynonyms === "object" && vramlabSynonyms ? vramlabSynonyms : {};
  var WIDEST = Object.keys(synonyms).reduce(function (n, k) { return Math.max(n, k.split(" ").length); }, 0);

  function chinese(tokens) {
    var lower = tokens.map(function (t) { return t.toLowerCase(); }), out = [];
    for (var i = 0; i < lower.length; i++) {
      for (var j = Math.min(lower.length, i + WIDEST); j > i; j--) {
        var found = Object.prototype.hasOwnProperty.call(synonyms, lower.slice(i, j).join(" "))
          ? synonyms[lower.slice(i, j).join(" ")] : null;
        if (!found) continue;
        found.forEach(function (term) {
          // one word of the index, or two (键值缓存 is cut 键值 + 缓存); longer cuts bring too
          // many common words along (零冗余优化器: 零 + 冗余 + 优化器)
          var parts = HAN.test(term) && !/\s/.test(term) ? cut(term) : [];
          if (parts.length > 2 || !parts.every(function (w) { return w.length > 1 && known(w); })) return;
          parts.forEach(function (w) {
            if (lower.indexOf(w) < 0 && !out.some(function (o) { return o.word === w; }))
              out.push({ word: w, prefix: parts.length === 1 });   // a lone word also as a prefix
          });
        });
        i = j - 1;
        break;
      }
    }
    return out;
  }

  function rewrite(query) {
    var out = [], plain = [];
    query.trim().split(/\s+/).forEach(function (part) {
      if (!part) return;
      if (SYNTAX.test(part)) {
        // the reader's own lunr syntax: only cut its Han runs, keeping a leading +/- on each word
        var sign = /^[+-]/.test(part) ? part[0] : "";
        var rest = sign ? part.slice(1) : part;
        out.push(rest.split(HAN_RUNS).filter(Boolean).map(function (piece) {
          return HAN.test(piece) ? cut(piece).map(function (w) { return sign + w; }).join(" ") : sign + piece;
        }).join(" "));
        return;
      }
      terms(part).forEach(function (w) { plain.push(w); out.push(w + "^" + EXACT, w); });
    });
    // a glossary term counts as a word of the query; one cut in two, as whole words only
    chinese(plain).forEach(function (s) { out.push(s.word + "^" + EXACT); if (s.prefix) out.push(s.word); });
    return out.join(" ");
  }

  // Material's protocol (integrations/search/worker/message): 0 = setup, 2 = query.
  addEventListener("message", function (ev) {
    var message = ev.data;
    if (!message) return;
    if (message.type === 0 && message.data && message.data.config && message.data.config.separator)
      separator = new RegExp(message.data.config.separator);
    else if (message.type === 2 && typeof message.data === "string" && words !== null)
      message.data = rewrite(message.data);
  });

  return {
    rewrite: rewrite,
    patchLunr: function (lunr) {
      // lunr 2.3.9 names a token-set node by final flag + (edge label + target id)..., with nothing
      // between an id and the next label: {"a": 12, "3": 4} and {"a": 1, "2": 34} are both
      // "0a1234". Its builder merges nodes whose names are equal, so with digits in the vocabulary
      // (code on the pages: "{m36", "88.0}") it invented words the inverted index lacks and lost
      // some it has; a prefix query reaching an invented word threw (lunr issue #314: "Cannot
      // read property '_index' of undefined"), so "P-Tuning v2" found nothing. A ";" after each
      // id makes the name unambiguous: a label is one character, an id only digits.
      lunr.TokenSet.prototype.toString = function () {
        if (this._str) return this._str;
        var str = this.final ? "1" : "0", labels = Object.keys(this.edges).sort();
        for (var i = 0; i < labels.length; i++) str += labels[i] + this.edges[labels[i]].id + ";";
        return str;
      };
      var build = lunr.Builder.prototype.build;
      lunr.Builder.prototype.build = function () {
        var index = build.apply(this, arguments);
        words = index.invertedIndex;
        index.invertedIndex = new Proxy(words, { has: function () { return false; } });
        return index;
      };
    }
  };
})();
