// Every heatmap blocklab draws, on both of its pages: the static `blocklab trace --html` page inlines this
// file, `blocklab explore` serves it as /static/heatmap.js. The colour scales, number format and colorbar;
// one map drawn on a canvas; the hover tooltip; and each number's explanation with its operands, read
// from the trace JSON's stage records (their `operands` and `norm`, computed by the tracer in Python):
// this file only formats numbers, so both pages say the same of the same number. Defines
// ``blocklabHeatmap``.
var blocklabHeatmap = (function () {
  "use strict";
  var DIV = [[33, 102, 172], [247, 247, 247], [178, 24, 43]];  // diverging, symmetric about 0
  var SEQ = [[247, 251, 255], [107, 174, 214], [8, 48, 107]];  // sequential (probabilities, weights)
  var FONT = "11px ui-monospace, Menlo, monospace", INK = "#344054", MASKED = "#d0d5dd";
  var probe = document.createElement("canvas").getContext("2d");
  probe.font = FONT;

  // ---- colours and numbers ----------------------------------------------------------------------------
  function mix(stops, t) {
    t = Math.max(0, Math.min(1, t));
    var i = t < 0.5 ? 0 : 1, u = t < 0.5 ? t * 2 : (t - 0.5) * 2, a = stops[i], b = stops[i + 1];
    var rgb = [0, 1, 2].map(function (k) { return Math.round(a[k] + (b[k] - a[k]) * u); });
    return "rgb(" + rgb.join(",") + ")";
  }
  function number(v, decimals) {  // a colorbar tick: short
    var a = Math.abs(v);
    return a !== 0 && (a >= 1e4 || a < 1e-3) ? v.toExponential(2) : v.toFixed(Math.min(decimals, 3));
  }
  function fmt(v, decimals) {  // a value as the tables show it; null is a masked score
    return v === null || v === undefined ? "masked" : v.toFixed(decimals);
  }
  function range(rows, sequential) {
    // a map's own colour scale (as html.py's value_range): sequential from 0 (or the smallest value) to
    // the largest; diverging symmetric about 0; null entries (masked) left out
    var lo = Infinity, hi = -Infinity;
    rows.forEach(function (r) { r.forEach(function (v) { if (v !== null) { lo = Math.min(lo, v); hi = Math.max(hi, v); } }); });
    if (!isFinite(lo)) { lo = 0; hi = 0; }
    if (sequential) { var from = Math.min(lo, 0); return [from, hi > from ? hi : from + 1]; }
    var m = Math.max(Math.abs(lo), Math.abs(hi)) || 1;
    return [-m, m];
  }
  function barRoom(lo, hi, decimals) {  // a colorbar at a map's right: gap, bar, tick, its widest number
    var texts = [lo, (lo + hi) / 2, hi].map(function (v) { return probe.measureText(number(v, decimals)).width; });
    return 10 + 17 + Math.ceil(Math.max.apply(null, texts)) + 4;
  }
  function colorbar(g, x, y, h, lo, hi, sequential, decimals) {
    // a vertical bar from lo (bottom) to hi (top), ticks at the ends and the middle (0 when diverging)
    for (var i = 0; i < h; i++) {
      g.fillStyle = mix(sequential ? SEQ : DIV, 1 - i / Math.max(1, h - 1));
      g.fillRect(x, y + i, 10, 1);
    }
    g.strokeStyle = "#98a2b3"; g.strokeRect(x + 0.5, y + 0.5, 10, h - 1);
    g.font = FONT; g.fillStyle = INK; g.textAlign = "left"; g.textBaseline = "middle";
    [[hi, 0], [(lo + hi) / 2, 0.5], [lo, 1]].forEach(function (tick) {
      var ty = y + tick[1] * (h - 1);
      g.fillRect(x + 10, Math.round(ty), 4, 1);
      g.fillText(number(tick[0], decimals), x + 17, Math.min(Math.max(ty, y + 5), y + h - 5));
    });
  }

  // ---- one map -------------------------------------------------------------------------------------------
  function longest(labels) { return Math.max.apply(null, labels.map(function (s) { return s.length; })); }
  function margins(m) {
    // the room a map takes beside its cells: row labels at the left; at the right its colorbar (m.bar) or,
    // where none, the lean of the last rotated column labels
    var lean = m.colLabels ? Math.ceil(2.6 * Math.min(14, longest(m.colLabels))) : 0;
    return { left: 12 + 7 * longest(m.rowLabels), right: Math.max(m.bar ? barRoom(m.range[0], m.range[1], m.decimals) : 4, lean) };
  }
  function fit(m, width, most) {
    // the widest cells (at most ``most`` px, at least 1) with which map m, drawn with ``draw``, fits ``width``
    var room = margins(m);
    return Math.max(1, Math.min(most, Math.floor((width - room.left - room.right) / m.rows[0].length)));
  }
  function cellText(v, decimals) { return v === null ? "-inf" : v.toFixed(decimals); }  // null: a masked score
  var NUMBER_FONT = "10px ui-monospace, Menlo, monospace";  // a number in its cell
  function numberWidth(m) {
    // the px a cell needs to show its number (m.decimals digits; -inf where masked), with a little air
    var widest = 0;
    probe.font = NUMBER_FONT;
    m.rows.forEach(function (r) { r.forEach(function (v) { widest = Math.max(widest, probe.measureText(cellText(v, m.decimals)).width); }); });
    probe.font = FONT;
    return Math.ceil(widest) + 6;
  }
  function draw(canvas, m, size) {
    // m: rows (null: masked), rowLabels, colLabels (or null), sequential, range [lo, hi], decimals,
    // group (a separator every group columns: heads), bar (its own colorbar), selected (a row outlined);
    // size: cw, ch (each page fits its cells to its own width). Sets canvas.cell (where the cells are) and
    // data-range (the scale drawn with); the browser tests read both.
    var R = m.rows.length, C = m.rows[0].length, cw = size.cw, ch = size.ch;
    var lo = m.range[0], hi = m.range[1], room = margins(m), left = room.left;
    var top = m.colLabels ? 8 + 6.5 * Math.min(14, longest(m.colLabels)) : 6;
    var barHeight = Math.max(60, R * ch);
    var rowStep = Math.ceil(12 / ch), colStep = Math.ceil(12 / cw);  // thin the labels so none overlap
    var W = left + C * cw + room.right, H = top + (m.bar ? barHeight : R * ch) + 2;
    var dpr = window.devicePixelRatio || 1;
    canvas.width = W * dpr; canvas.height = H * dpr;
    canvas.style.width = W + "px"; canvas.style.height = H + "px";
    var g = canvas.getContext("2d");
    g.setTransform(dpr, 0, 0, dpr, 0, 0);
    g.clearRect(0, 0, W, H);
    canvas.dataset.range = lo + "," + hi;
    g.font = FONT; g.textBaseline = "middle";
    for (var r = 0; r < R; r++) {
      if (r % rowStep === 0) {
        g.textAlign = "right"; g.fillStyle = INK;
        g.fillText(m.rowLabels[r], left - 6, top + r * ch + ch / 2);
      }
      for (var c = 0; c < C; c++) {
        var v = m.rows[r][c];
        g.fillStyle = v === null ? MASKED : mix(m.sequential ? SEQ : DIV, (v - lo) / (hi - lo));
        g.fillRect(left + c * cw, top + r * ch, cw, ch);
      }
    }
    if (size.numbers) {  // a small map: each cell's number on it, dark or light ink against its colour
      g.textAlign = "center"; g.font = NUMBER_FONT;
      for (var nr = 0; nr < R; nr++) {
        for (var nc = 0; nc < C; nc++) {
          var nv = m.rows[nr][nc], t = nv === null ? 0.5 : (nv - lo) / (hi - lo);
          g.fillStyle = nv !== null && (t < 0.2 || (!m.sequential && t > 0.8) || (m.sequential && t > 0.6)) ? "#fff" : INK;
          g.fillText(cellText(nv, m.decimals), left + nc * cw + cw / 2, top + nr * ch + ch / 2);
        }
      }
      g.font = FONT;
    }
    if (m.group) {
      g.fillStyle = "#1d2433";  // head boundaries
      for (var s = m.group; s < C; s += m.group) { g.fillRect(left + s * cw - 1, top - 3, 2, R * ch + 6); }
    }
    if (m.colLabels) {
      g.save(); g.fillStyle = INK; g.textAlign = "left";
      for (var k = 0; k < C; k += colStep) {
        g.save(); g.translate(left + k * cw + cw / 2 + 3, top - 4); g.rotate(-Math.PI / 2.6);
        g.fillText(m.colLabels[k].slice(0, 14), 0, 0); g.restore();
      }
      g.restore();
    }
    if (m.selected !== null && m.selected !== undefined) {
      g.strokeStyle = "#3056d3"; g.lineWidth = 2;
      g.strokeRect(left + 1, top + m.selected * ch + 1, C * cw - 2, ch - 2);
    }
    if (canvas.cursor) {  // the cell the keyboard is on: a dark frame with a white inner line
      var cx = left + canvas.cursor[1] * cw, cy = top + canvas.cursor[0] * ch;
      g.lineWidth = 2; g.strokeStyle = "#101828"; g.strokeRect(cx - 1, cy - 1, cw + 2, ch + 2);
      g.lineWidth = 1; g.strokeStyle = "#fff"; g.strokeRect(cx + 0.5, cy + 0.5, Math.max(1, cw - 1), Math.max(1, ch - 1));
    }
    if (m.bar) { colorbar(g, left + C * cw + 10, top, barHeight, lo, hi, m.sequential, m.decimals); }
    canvas.cell = { left: left, top: top, cw: cw, ch: ch, R: R, C: C, numbers: !!size.numbers };
  }

  // ---- a stage's numbers and their explanations ------------------------------------------------------------
  function title(stage, head) { return stage.name + (head === null || head === undefined ? "" : " head " + head); }
  function rows(stage, head, columns) {
    // the matrix a map shows: the stage's values (positions x features), or one head's query x key map;
    // ``columns``: the features shown (null: all)
    var all = head === null || head === undefined ? stage.values : stage.heads[head];
    return columns ? all.map(function (row) { return columns.map(function (j) { return row[j]; }); }) : all;
  }
  function short(name) { return name.replace(/^blocks\.\d+\./, ""); }
  function terms(lines, n, index, xs, ws, rest, letter, f) {
    // a product's largest terms a_i × b_i, one line each, aligned in columns (i, a_i, b_i, the product),
    // then the other terms' sum
    var cells = index.map(function (i, t) { return [String(i), f(xs[t]), f(ws[t]), f(xs[t] * ws[t])]; });
    var width = cells.reduce(function (a, c) { return c.map(function (v, k) { return Math.max(a[k], v.length); }); }, [0, 0, 0, 0]);
    cells.forEach(function (c) {
      var p = c.map(function (v, k) { return v.padStart(width[k]); });
      lines.push("    " + letter + " " + p[0] + ":  " + p[1] + " × " + p[2] + " = " + p[3]);
    });
    lines.push("  + the other " + (n - index.length) + " terms  " + f(rest));
    return lines;
  }
  function norm(s, f) {
    // a norm's number: gamma × z_hat + beta, and z_hat from the norm's input x, mu and the denominator
    var n = s.norm;
    return function (r, j) {
      var g = n.gamma ? n.gamma[j] : null, b = n.beta ? n.beta[j] : null;
      var first = "= " + (g === null ? "" : "gamma[" + j + "] × ") + "z_hat" + (b === null ? "" : " + beta[" + j + "]");
      if (g !== null || b !== null) {
        first += " = " + (g === null ? "" : f(g) + " × ") + f(n.z_hat[r][j]) + (b === null ? "" : " + " + f(b));
      }
      var x = n.x ? n.x[r][j] : null, centred = n.formula && n.formula.indexOf("mu") >= 0;
      var second = "  z_hat = " + (n.formula || "(x - mu) / denominator") + " = " +
        (x === null ? "" : (centred ? "(" + f(x) + " - " + f(n.mu[r]) + ")" : f(x)) + " / " + f(n.denom[r]) + " = ") +
        f(n.z_hat[r][j]);
      return first + "\n" + second;
    };
  }
  function explain(stages, s, head, decimals) {
    // how(r, j): how the number at row r, feature j (a key, for a head's map) of stage record ``s`` was
    // computed, from its operands record (operands.py) or its norm; null where it has neither.
    // ``stages``: the trace's records by name, for operands that are stages
    var f = function (v) { return fmt(v, decimals); };
    var o = s.operands;
    if (s.norm && s.norm.z_hat) { return norm(s, f); }
    var carried = o && ["dot", "qk", "mix", "head_dot"].indexOf(o.kind) >= 0;  // the products carry their operands
    if (!o || (!carried && !o.reads.every(function (name) { return stages[name]; }))) { return null; }
    var read = o.reads.map(function (name) { return stages[name]; }), names = o.reads.map(short);
    if (o.kind === "sum") {
      return function (r, j) {
        return "= " + read.map(function (t) { return short(t.name) + " " + f(t.values[r][j]); }).join(" + ");
      };
    }
    if (o.kind === "act") {
      return function (r, j) { return "= " + o["function"] + "(" + short(read[0].name) + " " + f(read[0].values[r][j]) + ")"; };
    }
    if (o.kind === "gated") {
      return function (r, j) {
        return "= " + o["function"] + "(" + short(read[0].name) + " " + f(read[0].values[r][j]) + ") × " +
          short(read[1].name) + " " + f(read[1].values[r][j]) + "\n= " + f(o.gate[r][j]) + " × " + f(read[1].values[r][j]);
      };
    }
    if (o.kind === "softmax") {
      return function (r, k) {
        return "= softmax over the keys of this row of " + short(read[0].name) + " (here " + f(read[0].heads[head][r][k]) + ")";
      };
    }
    if (o.kind === "qk") {
      return function (r, k) {
        var p = s.positions[r], at = [head, r, k];
        var pick = function (a) { return at.reduce(function (v, i) { return v[i]; }, a); };
        if (s.heads[head][r][k] === null) {
          return "masked: key " + k + " is hidden from query " + p + " (-inf, so its weight is 0)";
        }
        var dotted = pick(o.x).reduce(function (a, x, t) { return a + x * pick(o.w)[t]; }, 0) + pick(o.rest);
        var lines = ["= " + names[0] + "[" + p + "] · " + names[1] + "[" + k + "] / " + (o.scale === Math.sqrt(o.n) ? "sqrt(" + o.n + ")" : f(o.scale)) + "   (head " + head + ")",
          "= " + f(dotted) + " / " + f(o.scale),
          "  the " + o.n + " terms " + names[0] + "[" + p + ", i] × " + names[1] + "[" + k + ", i], the " + pick(o.index).length + " largest:"];
        return terms(lines, o.n, pick(o.index), pick(o.x), pick(o.w), pick(o.rest), "i", f).join("\n");
      };
    }
    if (o.kind === "mix") {
      var d_k = s.shape[3];
      return function (r, j) {
        var p = s.positions[r], h = Math.floor(j / d_k), i = j % d_k;
        var lines = ["= the sum over the " + o.n + " keys k of " + names[0] + "[head " + h + "][" + p + ", k] × " +
          names[1] + "[k, dim " + i + "]   (head " + h + ", dim " + i + ")",
          "  the " + o.index[r][j].length + " largest terms (weight × value):"];
        return terms(lines, o.n, o.index[r][j], o.x[r][j], o.w[r][j], o.rest[r][j], "k", f).join("\n");
      };
    }
    var at = {};  // dot, head_dot: feature -> its place among the covered columns
    (o.columns || s.values[0].map(function (_, j) { return j; })).forEach(function (j, i) { at[j] = i; });
    if (o.kind === "head_dot") {
      var d_model = s.shape[3];
      return function (r, c) {
        var i = at[c];
        if (i === undefined) { return ""; }
        var p = s.positions[r], h = Math.floor(c / d_model), j = c % d_model, idx = o.index[r][i];
        var lines = ["= " + names[0] + "[" + p + ", head " + h + "] · " + o.weight + "[" + j + ", head " + h + "'s " +
          o.n + " columns]   (head " + h + ", feature " + j + "; no bias: bo is added once, to the heads' sum)",
          "  the " + o.n + " terms " + names[0] + "[" + p + ", head " + h + ", i] × " + o.weight + "[" + j + ", head " + h +
          ", i], the " + idx.length + " largest:"];
        return terms(lines, o.n, idx, o.x[r][i], o.w[r][i], o.rest[r][i], "i", f).join("\n");
      };
    }
    if (o.kind === "dot") {
      var input = names[0], d_head = s.shape.length === 4 && ["attn.q", "attn.k", "attn.v"].indexOf(s.kind) >= 0 ? s.shape[3] : 0;
      return function (r, j) {
        var i = at[j];
        if (i === undefined) { return ""; }
        var p = s.positions[r], idx = o.index[r][i], K = idx.length;
        var lines = ["= " + input + "[" + p + "] · " + o.weight + "[" + j + "]" + (o.bias ? " + " + o.bias + "[" + j + "]" : "") +
          (d_head ? "   (head " + Math.floor(j / d_head) + ", dim " + (j % d_head) + ")" : ""),
          "  the " + o.n + " terms " + input + "[" + p + ", i] × " + o.weight + "[" + j + ", i], the " + K + " largest:"];
        terms(lines, o.n, idx, o.x[r][i], o.w[r][i], o.rest[r][i], "i", f);
        if (o.bias) { lines.push("  + " + o.bias + "[" + j + "]  " + f(o.bias_values[i])); }
        return lines.join("\n");
      };
    }
    return null;
  }

  // ---- hovering ---------------------------------------------------------------------------------------------
  function text(name, m, r, c, how) {
    // the tooltip: the map, where the cell is and its value, then how it was computed (``how`` is given
    // the feature: m.columns maps a shown column to it)
    var j = m.columns ? m.columns[c] : c, line = how ? how(r, j) : "";
    return name + "\n" + m.rowLabels[r] + " · " + (m.colLabels ? m.colLabels[c] : "feature " + j) + " = " +
      fmt(m.rows[r][c], m.decimals) + (line ? "\n" + line : "");
  }
  var live = null;  // the page's one polite live region: a screen reader reads each explanation out
  function announce(text) {
    if (!live) {
      live = document.createElement("div");
      live.id = "explain-live"; live.setAttribute("role", "status"); live.setAttribute("aria-live", "polite");
      live.style.cssText = "position:absolute;width:1px;height:1px;overflow:hidden;clip:rect(0 0 0 0);white-space:pre";
      document.body.appendChild(live);
    }
    live.textContent = text;
  }
  function show(tip, text, x, y) {
    tip.textContent = text;
    tip.hidden = false;
    tip.style.left = Math.max(4, Math.min(x, window.innerWidth - tip.offsetWidth - 4)) + "px";
    tip.style.top = Math.max(4, Math.min(y, window.innerHeight - tip.offsetHeight - 4)) + "px";
  }
  function hover(canvas, tip, name, m, how) {
    // the explanation of the cell under the mouse; and from the keyboard: the map takes the focus (Tab),
    // the arrow keys (Home, End: the row's ends) move an outlined cell whose explanation is shown beside it
    // and read out (the live region)
    canvas.addEventListener("mousemove", function (e) {
      var b = canvas.getBoundingClientRect(), L = canvas.cell;
      var c = Math.floor((e.clientX - b.left - L.left) / L.cw), r = Math.floor((e.clientY - b.top - L.top) / L.ch);
      if (r < 0 || r >= L.R || c < 0 || c >= L.C) { tip.hidden = true; return; }
      show(tip, text(name, m, r, c, how), e.clientX + 14, e.clientY + 12);
    });
    canvas.addEventListener("mouseleave", function () { if (document.activeElement !== canvas) { tip.hidden = true; } });
    canvas.tabIndex = 0;
    canvas.setAttribute("role", "img");
    canvas.setAttribute("aria-label", name + ": a map of " + m.rows.length + " by " + m.rows[0].length +
                        " numbers; the arrow keys move from number to number and explain each");
    function cursor(r, c) {
      var L = canvas.cell;
      r = Math.max(0, Math.min(L.R - 1, r)); c = Math.max(0, Math.min(L.C - 1, c));
      canvas.cursor = [r, c];
      draw(canvas, m, { cw: L.cw, ch: L.ch, numbers: L.numbers });
      var b = canvas.getBoundingClientRect(), words = text(name, m, r, c, how);
      show(tip, words, b.left + L.left + (c + 1) * L.cw + 8, b.top + L.top + (r + 1) * L.ch + 6);
      announce(words);
    }
    canvas.addEventListener("focus", function () {
      var at = canvas.cursor || [m.selected === null || m.selected === undefined ? 0 : m.selected, 0];
      cursor(at[0], at[1]);
    });
    canvas.addEventListener("blur", function () { tip.hidden = true; canvas.cursor = null; draw(canvas, m, { cw: canvas.cell.cw, ch: canvas.cell.ch, numbers: canvas.cell.numbers }); });
    canvas.addEventListener("keydown", function (e) {
      var step = { ArrowUp: [-1, 0], ArrowDown: [1, 0], ArrowLeft: [0, -1], ArrowRight: [0, 1] }[e.key];
      var at = canvas.cursor || [0, 0];
      if (e.key === "Home") { step = [0, -at[1]]; }
      if (e.key === "End") { step = [0, canvas.cell.C]; }
      if (!step) { return; }
      e.preventDefault();
      cursor(at[0] + step[0], at[1] + step[1]);
    });
  }

  return { DIV: DIV, SEQ: SEQ, FONT: FONT, INK: INK, mix: mix, number: number, fmt: fmt, range: range,
    numberWidth: numberWidth,
           barRoom: barRoom, colorbar: colorbar, margins: margins, fit: fit, draw: draw, title: title, rows: rows, explain: explain,
           text: text, hover: hover, announce: announce };
})();
