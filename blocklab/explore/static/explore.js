// blocklab explore: the page. Plain JavaScript, no build step, no network but this server's /api.
// Every number shown comes from the server (the tracer's JSON, the hook API's predictions); this script
// only draws them. When a trace is drawn it sets data-rendered on <html> (the browser tests wait for it).
(function () {
  "use strict";
  var $ = function (id) { return document.getElementById(id); };
  var H = blocklabHeatmap;  // heatmaps, colours and hover explanations, shared with the static trace page
  var STATS = ["mean", "var", "std", "min", "max", "l2"];
  var DECIMALS = 4, MAX_COLUMNS = 256, DEBOUNCE_MS = 250;
  var state = { models: [], model: null, group: "block-0", ablate: [], position: null, trace: null,
                serial: 0, timer: null, current: null, compare: null, grads: null, byhand: null };

  // ---- talking to the server -------------------------------------------------------------------------
  function post(action, extra) {
    var body = Object.assign(inputBody(), extra || {});
    return fetch("/api/" + action, { method: "POST", headers: { "Content-Type": "application/json" },
                                      body: JSON.stringify(body) })
      .then(function (r) {
        return r.json().then(function (data) {
          if (!r.ok) { throw new Error(data.error || ("HTTP " + r.status)); }
          return data;
        });
      });
  }
  function inputBody() {
    var m = state.model, text = $("input").value, target = $("target").value.trim();
    var body = { model: m.name, ablate: state.ablate, temperature: +$("temperature").value };
    var k = parseInt($("top-k").value, 10);
    if (k > 0) { body.top_k = k; }
    if (m.tokenizer) { body.input = text; } else { body.tokens = text; }
    if (target) { body.target = target; }
    if (state.ablate.some(function (a) { return a.mode === "patch"; })) { body.patch_from = $("patch-from").value; }
    return body;
  }
  function gradKey() {  // what gradients depend on
    var b = inputBody();
    return JSON.stringify([b.model, b.input, b.tokens, b.target, b.ablate]);
  }
  function setStatus(text, bad) {
    $("status").textContent = text;
    $("status").className = bad ? "error" : "";
  }

  // ---- numbers and heatmaps ---------------------------------------------------------------------------
  function fmt(v) { return H.fmt(v, DECIMALS); }
  function small(v) {  // a gradient norm: tiny ones in exponent notation, not 0.0000
    var a = Math.abs(v);
    return a !== 0 && a < 1e-3 ? v.toExponential(2) : v.toFixed(DECIMALS);
  }
  var tip = $("tip");
  var NUMBERS_UP_TO = 32;  // a map at most this many columns and rows shows its numbers when they fit its card
  function heatmap(s, m, name, how) {
    // stage s's map m (rows, labels, columns shown) drawn by heatmap.js with cells as wide as the stage
    // cards allow (its colorbar in view), a separator between heads, the chosen position outlined;
    // hovering a cell, or moving to it with the arrow keys, shows its value and ``how`` it was computed
    var R = m.rows.length, canvas = document.createElement("canvas");
    m.range = H.range(m.rows, m.sequential); m.bar = true; m.decimals = DECIMALS;
    m.group = !s.heads && state.model.per_head_kinds.indexOf(s.kind) >= 0 ? s.shape[s.shape.length - 1] : 0;
    m.selected = state.position === null || s.positions.indexOf(state.position) < 0 ? null : s.positions.indexOf(state.position);
    var width = cardWidth();  // a head's map: two side by side where their cells can be 10 px or more
    var need = H.numberWidth(m);  // a small map whose numbers fit in its cells shows them (the tutorial's sizes)
    if (s.heads && H.fit(m, width / 2 - 9, need) >= (m.rows[0].length <= NUMBERS_UP_TO ? need : 10)) { width = width / 2 - 9; }
    var small = m.rows[0].length <= NUMBERS_UP_TO && R <= NUMBERS_UP_TO;
    var numbers = small && H.fit(m, width, need) >= need;
    if (small && !numbers) {  // the numbers without a colour scale beside them, where only that fits
      m.bar = false; numbers = H.fit(m, width, need) >= need; m.bar = !numbers;
    }
    H.draw(canvas, m, numbers ? { cw: need, ch: 18, numbers: true } : { cw: H.fit(m, width, 24), ch: R > 24 ? 9 : 14 });
    H.hover(canvas, tip, name, m, how);
    var wrap = document.createElement("div");
    wrap.className = "scroll"; wrap.appendChild(canvas);
    return wrap;
  }
  function cardWidth() {  // the width inside a stage card: the stages column less a card's padding and border
    var box = $("stages"), style = getComputedStyle(box);
    return box.clientWidth - parseFloat(style.paddingLeft) - parseFloat(style.paddingRight) - 2 * 14 - 2;
  }

  // ---- the model's groups and the block diagram (from the layouts table) --------------------------------
  function groups() {
    var c = state.model.config, out = [["input", "Input"]];
    for (var b = 0; b < c.n_layers; b++) {  // per-layer kinds (Gemma 2, GPT-Neo): a local block says its window
      var w = c.layer_windows ? c.layer_windows[b] : null;
      out.push(["block-" + b, "block " + b + (w ? " · local " + w : "")]);
    }
    out.push(["after", "After the blocks"]);
    return out;
  }
  function groupStages(group) {
    var own = state.model.norm_own_stages;  // a norm's inner stages: the norm's own numbers show them
    var names = state.model.stages.filter(function (n) { return own.indexOf(n.split(".").pop()) < 0; });
    if (group === "input") { return names.filter(function (n) { return n.indexOf("blocks.") !== 0 && ["ln_f", "logits", "probs", "loss"].indexOf(n) < 0; }); }
    if (group === "after") { return names.filter(function (n) { return ["ln_f", "logits", "probs", "loss"].indexOf(n) >= 0; }); }
    var prefix = "blocks." + group.split("-")[1] + ".";
    return names.filter(function (n) { return n.indexOf(prefix) === 0; });
  }
  function block() { return state.group.indexOf("block-") === 0 ? +state.group.split("-")[1] : null; }
  function drawGroups() {
    var box = $("groups");
    box.innerHTML = "";
    groups().forEach(function (g) {
      var b = document.createElement("button");
      b.type = "button"; b.textContent = g[1]; b.setAttribute("role", "tab"); b.dataset.group = g[0];
      b.setAttribute("aria-selected", String(g[0] === state.group));
      b.addEventListener("click", function () { state.group = g[0]; drawGroups(); drawDiagram(); drawIntervene(); retrace(0); });
      box.appendChild(b);
    });
  }
  function svg(tag, attrs, parent) {
    var el = document.createElementNS("http://www.w3.org/2000/svg", tag);
    Object.keys(attrs).forEach(function (k) { el.setAttribute(k, attrs[k]); });
    if (parent) { parent.appendChild(el); }
    return el;
  }
  function drawDiagram() {
    // one row per step of LAYOUTS[norm_position].steps; the residual stream (resid_pre, each sum, and a
    // norm read as a sum's x or as the block's output) in the left column, each sum's branches to its right
    var layout = state.model.layout, root = $("diagram"), b = block();
    root.innerHTML = "";
    $("formula").textContent = layout.formula;
    if (b === null) { root.setAttribute("height", "0"); return; }
    var stream = { resid_pre: true }, column = {}, producer = {};
    layout.steps.forEach(function (s) {
      if (s.type === "sum") { stream[s.out] = true; stream[s.x] = true; }
    });
    stream[layout.output] = true;
    layout.steps.forEach(function (s) {  // a sum's k-th branch and what feeds it sit in column k + 1
      if (s.type !== "sum") { return; }
      s.branches.forEach(function (br, k) {
        var walk = [br];
        while (walk.length) {
          var name = walk.pop();
          if (stream[name] || column[name] !== undefined) { continue; }
          column[name] = k + 1;
          var st = layout.steps.filter(function (t) { return t.out === name; })[0];
          if (st) { walk = walk.concat(st.reads); }
        }
      });
    });
    var nodes = [{ name: "resid_pre", out: "resid_pre", type: "stream", reads: [] }].concat(layout.steps);
    var W = 260, rowH = 46, colX = [40, 130, 210];
    var defs = svg("defs", {}, root), marker = svg("marker", { id: "arrow", viewBox: "0 0 8 8", refX: 7, refY: 4,
      markerWidth: 7, markerHeight: 7, orient: "auto-start-reverse" }, defs);
    svg("path", { d: "M0,0 L8,4 L0,8 z", fill: "#98a2b3" }, marker);
    var at = {};
    nodes.forEach(function (n, i) {
      at[n.out] = { x: colX[stream[n.out] ? 0 : Math.min(2, column[n.out] || 1)], y: 24 + i * rowH };
      producer[n.out] = n;
    });
    var edges = svg("g", {}, root), labels = [];
    nodes.forEach(function (n) {
      n.reads.forEach(function (src) {
        var a = at[src], z = at[n.out], identity = n.type === "sum" && src === n.x;
        var d = a.x === z.x ? "M" + a.x + "," + (a.y + 14) + " L" + z.x + "," + (z.y - 15)
          : "M" + a.x + "," + (a.y + 14) + " C" + a.x + "," + (z.y - 10) + " " + z.x + "," + (a.y + 20) + " " + z.x + "," + (z.y - 15);
        var path = svg("path", { d: d, "class": "edge" + (identity ? " identity" : "") }, edges);
        var g = n.type === "sum" ? pathGradient(n, src, identity, b) : null;
        if (g !== null) { labels.push([path, g, identity]); }
      });
    });
    labels.forEach(function (l) {  // ||dL/dx|| along each path into a residual sum (after "compute gradients")
      var mid = l[0].getPointAtLength(l[0].getTotalLength() / 2);
      var t = svg("text", { x: mid.x + (l[2] ? -36 : 4), y: mid.y, "class": "grad" + (l[2] ? " identity" : "") }, root);
      t.textContent = small(l[1]);
    });
    nodes.forEach(function (n) {
      var p = at[n.out], stage = "blocks." + b + "." + (n.type === "sublayer" ? n.out : n.out);
      var g = svg("g", { "class": "node " + n.type + (isAblated(n) ? " ablated" : ""), tabindex: 0,
                         role: "button", "data-stage": stage, "aria-label": "stage " + stage }, root);
      var label = n.type === "sublayer" ? (n.name === "attn" ? "attention" : "FFN") : n.out;
      if (n.type === "sum") {
        svg("circle", { cx: p.x, cy: p.y, r: 13 }, g);
        svg("text", { x: p.x, y: p.y + 4, "text-anchor": "middle" }, g).textContent = n.symbol;  // the residual kind's
        svg("text", { x: p.x + 18, y: p.y + 4 }, g).textContent = n.out + (n.residual ? "" : "");
      } else {
        var w = Math.max(64, 8 * label.length + 12);
        svg("rect", { x: p.x - w / 2, y: p.y - 13, width: w, height: 26, rx: 5 }, g);
        svg("text", { x: p.x, y: p.y + 4, "text-anchor": "middle" }, g).textContent = label;
      }
      var go = function () { focusStage(stage); };
      g.addEventListener("click", go);
      g.addEventListener("keydown", function (e) {  // from the keyboard: on to the stage's first map
        if (e.key !== "Enter" && e.key !== " ") { return; }
        e.preventDefault(); go();
        var map = document.querySelector("section.stage.current canvas");
        if (map) { map.focus({ preventScroll: true }); }
      });
    });
    root.setAttribute("height", String(nodes.length * rowH + 10));
    root.setAttribute("viewBox", "0 0 " + W + " " + (nodes.length * rowH + 10));
  }
  function pathGradient(sum, src, identity, b) {
    // the norm at the last position of the gradient flowing back along this edge of a residual sum:
    // the identity path (x) or the branch path of the sublayer whose branch it is (diagnostics' split)
    if (!state.grads || b === null) { return null; }
    var conns = state.model.layout.connections, layer = state.grads.paths[b], last = state.grads.target.position;
    var kinds = Object.keys(conns).filter(function (k) {
      return conns[k].out === sum.out && (identity || conns[k].branch === src);
    });
    if (!kinds.length) { return null; }
    var path = layer[kinds[0]];
    return identity ? path.identity[last] : path.branch[last];
  }
  function isAblated(n) {
    var b = block();
    return n.type === "sublayer" && state.ablate.some(function (a) {
      return a.kind === "sublayer" && a.block === b && a.name === n.name;
    });
  }
  function focusStage(stage) {
    var id = stage === "blocks." + block() + ".attn.out" ? stage : stage;
    var el = document.getElementById("stage-" + id) ||
      document.getElementById("stage-" + stage.replace(/\.(attn|ffn)\.out$/, ".$1.q")) ||
      document.getElementById("stage-" + stage.replace(/\.ffn\.out$/, ".ffn.hidden"));
    document.querySelectorAll("section.stage.current").forEach(function (s) { s.classList.remove("current"); });
    document.querySelectorAll("svg .node.current").forEach(function (s) { s.classList.remove("current"); });
    var node = document.querySelector('svg .node[data-stage="' + stage + '"]');
    if (node) { node.classList.add("current"); }
    if (el) { el.classList.add("current"); el.scrollIntoView({ block: "start", behavior: "smooth" }); }
    state.current = stage;
  }

  // ---- interventions -----------------------------------------------------------------------------------
  function same(a, b) {
    return a.kind === b.kind && a.block === b.block && a.index === b.index && a.name === b.name && a.mode === b.mode;
  }
  function mode() { return document.querySelector("input[name=mode]:checked").value; }
  function toggle(ablation) {
    var kept = state.ablate.filter(function (a) { return !same(a, ablation); });
    if (kept.length === state.ablate.length) { kept.push(ablation); }
    state.ablate = kept;
    drawIntervene(); drawDiagram(); retrace(0);
  }
  function describe(a) {
    return "block " + a.block + " " + (a.kind === "head" ? "head " + a.index : a.kind === "neuron" ? "FFN neuron " + a.index : a.name) +
      (a.mode === "patch" ? " patched" : " zeroed");
  }
  function drawIntervene() {
    var b = block(), c = state.model.config, heads = $("heads"), subs = $("sublayers");
    heads.innerHTML = ""; subs.innerHTML = "";
    if (b !== null) {
      for (var h = 0; h < c.n_heads; h++) {
        (function (h) {
          var a = { kind: "head", block: b, index: h, name: "", mode: mode() }, btn = document.createElement("button");
          btn.type = "button"; btn.textContent = "head " + h; btn.dataset.head = h;
          btn.setAttribute("aria-pressed", String(state.ablate.some(function (x) { return same(x, a); })));
          btn.title = "zero head " + h + " of block " + b + " (its attn.z)";
          btn.addEventListener("click", function () { a.mode = mode(); toggle(a); });
          heads.appendChild(btn);
        })(h);
      }
      ["attn", "ffn"].forEach(function (name) {
        var a = { kind: "sublayer", block: b, index: 0, name: name, mode: mode() }, btn = document.createElement("button");
        btn.type = "button"; btn.textContent = "zero " + name + ".out"; btn.dataset.sublayer = name;
        btn.setAttribute("aria-pressed", String(state.ablate.some(function (x) { return same(x, a); })));
        btn.addEventListener("click", function () { a.mode = mode(); toggle(a); });
        subs.appendChild(btn);
      });
    } else {
      heads.innerHTML = '<p class="muted small">choose a block to intervene in it</p>';
    }
    $("neuron").max = c.d_ff - 1;
    var list = $("ablations");
    list.innerHTML = "";
    state.ablate.forEach(function (a) {
      var li = document.createElement("li"), btn = document.createElement("button");
      li.textContent = describe(a);
      btn.type = "button"; btn.textContent = "undo"; btn.addEventListener("click", function () { toggle(a); });
      li.appendChild(btn); list.appendChild(li);
    });
  }
  $("zero-neuron").addEventListener("click", function () {
    var b = block(), j = parseInt($("neuron").value, 10);
    if (b === null || isNaN(j)) { setStatus("choose a block and a neuron first", true); return; }
    if (mode() === "patch" && !$("patch-from").value.trim()) { setStatus("type the input to patch from first", true); return; }
    toggle({ kind: "neuron", block: b, index: j, name: "", mode: mode() });
  });

  // ---- the trace: stages of the chosen group -------------------------------------------------------------
  function drawTokens(trace) {
    var box = $("tokens");
    box.innerHTML = "";
    trace.input.tokens.forEach(function (t, i) {
      var chip = document.createElement("button");
      chip.type = "button"; chip.className = "tok"; chip.dataset.position = i;
      chip.setAttribute("aria-pressed", String(state.position === i));
      chip.innerHTML = "<b>" + i + "</b>";
      chip.appendChild(document.createTextNode(t));
      chip.addEventListener("click", function () {
        state.position = state.position === i ? null : i;
        drawTokens(state.trace); drawStages(state.trace);
      });
      box.appendChild(chip);
    });
  }
  function statsTable(trace, s) {
    var t = document.createElement("table"), extra = s.frac_le_zero ? ["<= 0"] : [];
    t.className = "stats";
    t.innerHTML = "<caption>per position</caption><thead><tr>" + ["pos", "token"].concat(STATS, extra)
      .map(function (h) { return "<th>" + h + "</th>"; }).join("") + "</tr></thead>";
    var body = document.createElement("tbody"), F = s.shape.length ? s.shape[s.shape.length - 1] : 1;
    s.positions.forEach(function (p, i) {
      var tr = document.createElement("tr");
      if (state.position === p) { tr.className = "sel"; }
      [String(p), trace.input.tokens[p]].forEach(function (text) {
        var td = document.createElement("td"); td.textContent = text; tr.appendChild(td);
      });
      STATS.forEach(function (k) {
        var td = document.createElement("td"), v = s[k][i];
        td.textContent = fmt(v); td.dataset.stage = s.name; td.dataset.stat = k; td.dataset.position = p;
        td.title = k + " of " + s.name + " at position " + p + " over its features: " + operands(s, k, i, F);
        tr.appendChild(td);
      });
      if (s.frac_le_zero) {
        var td = document.createElement("td"); td.textContent = (100 * s.frac_le_zero[i]).toFixed(1) + "%"; tr.appendChild(td);
      }
      body.appendChild(tr);
    });
    t.appendChild(body);
    return t;
  }
  function operands(s, k, i, F) {
    // how a statistic was computed, with its operands (var and std from the same row)
    var n = s.values[i] ? s.values[i].length : F;
    if (k === "mean") { return "sum of the " + n + " values / " + n; }
    if (k === "var") { return "mean((x - " + fmt(s.mean[i]) + ")^2) over " + n + " values (biased: divides by " + n + ")"; }
    if (k === "std") { return "sqrt(var) = sqrt(" + fmt(s["var"][i]) + ")"; }
    if (k === "l2") { return "sqrt(sum of squares) = sqrt(" + n + " * (var + mean^2)) = sqrt(" + n + " * (" + fmt(s["var"][i]) + " + " + fmt(s.mean[i]) + "^2))"; }
    return k + " over " + n + " values";
  }
  function normTable(trace, s) {
    var n = s.norm, t = document.createElement("table");
    t.className = "stats";
    var heads = ["pos", "token", "mu", "var", "sqrt(var+eps)", "z_hat var", "var/denom^2"];
    t.innerHTML = "<caption>" + (s.norm_module || "norm") + ", eps " + n.eps + ": the numbers it used</caption><thead><tr>" +
      heads.map(function (h) { return "<th>" + h + "</th>"; }).join("") + "</tr></thead>";
    var body = document.createElement("tbody");
    s.positions.forEach(function (p, i) {
      var tr = document.createElement("tr");
      [String(p), trace.input.tokens[p], fmt(n.mu[i]), fmt(n["var"][i]), fmt(n.denom[i]), n.z_hat_var[i].toFixed(8),
       n.expected_var[i].toFixed(8)].forEach(function (text, j) {
        var td = document.createElement("td"); td.textContent = text;
        if (j === 4) { td.title = "sqrt(" + fmt(n["var"][i]) + " + " + n.eps + ")"; }
        tr.appendChild(td);
      });
      body.appendChild(tr);
    });
    t.appendChild(body);
    return t;
  }
  function stageCard(trace, s) {
    var sec = document.createElement("section");
    sec.className = "stage"; sec.id = "stage-" + s.name; sec.dataset.stage = s.name;
    var h = document.createElement("h4");
    h.textContent = s.name;
    var shape = document.createElement("span");
    shape.className = "shape"; shape.textContent = "shape (" + s.shape.join(", ") + ")";
    h.appendChild(shape); sec.appendChild(h);
    var p = document.createElement("p");
    p.className = "explain"; p.textContent = s.explanation; sec.appendChild(p);
    if (s.kind === "loss") {
      var l = document.createElement("p"); l.className = "loss"; l.dataset.stat = "loss";
      l.textContent = "loss = " + fmt(s.values[0][0]); sec.appendChild(l);
      return sec;
    }
    var labels = s.positions.map(function (q) { return q + " " + trace.input.tokens[q]; });
    var byName = {};
    trace.stages.forEach(function (t) { byName[t.name] = t; });
    if (s.heads) {
      var maps = document.createElement("div");
      maps.className = "maps";
      var keys = trace.input.tokens.map(function (t, k) { return k + " " + t; });
      s.heads.forEach(function (_, hd) {
        var fig = document.createElement("figure"), m = { rows: H.rows(s, hd, null), rowLabels: labels, colLabels: keys,
                                                          sequential: s.kind === "attn.weights" };
        fig.appendChild(heatmap(s, m, H.title(s, hd), H.explain(byName, s, hd, DECIMALS)));
        var cap = document.createElement("figcaption");
        cap.textContent = "block " + s.block + " · head " + hd + " (query rows, key columns)";
        fig.appendChild(cap); maps.appendChild(fig);
      });
      sec.appendChild(maps);
    } else {
      var F = s.values[0].length, columns = null, order = false;
      if (s.columns && F > MAX_COLUMNS) {  // a vocabulary: its largest at the last position, in order
        var last = s.values[s.values.length - 1];
        columns = last.map(function (v, j) { return j; }).sort(function (a, b) { return last[b] - last[a]; }).slice(0, MAX_COLUMNS);
        order = true;
      } else if (F > MAX_COLUMNS) {  // the first ones
        columns = [];
        for (var j = 0; j < MAX_COLUMNS; j++) { columns.push(j); }
      }
      var m2 = { rows: H.rows(s, null, columns), rowLabels: labels, columns: columns, sequential: s.kind === "probs",
                 colLabels: s.columns ? (columns ? columns.map(function (j) { return s.columns[j]; }) : s.columns) : null };
      var fig2 = document.createElement("figure");
      fig2.appendChild(heatmap(s, m2, H.title(s, null), H.explain(byName, s, null, DECIMALS)));
      var cap2 = document.createElement("figcaption");
      cap2.textContent = (s.norm ? "after gamma/beta" : "values") + ": positions x " + F + " features" +
        (F > MAX_COLUMNS ? (order ? " (the " + MAX_COLUMNS + " largest at the last position)" : " (first " + MAX_COLUMNS + ")") : "");
      fig2.appendChild(cap2); sec.appendChild(fig2);
    }
    sec.appendChild(statsTable(trace, s));
    if (s.norm) { sec.appendChild(normTable(trace, s)); }
    var steps = (trace.walk || []).filter(function (w) {  // a norm's mu, var and denominator: in its table
      return w.stage === s.name && !(s.norm && w.columns.length === 1);
    });
    if (steps.length) { sec.appendChild(walkSteps(s, steps)); }
    return sec;
  }
  function walkSteps(s, steps) {
    // the tutorial's steps behind this stage that no stage holds (QK^T, scaled, exp, row sums; a norm's
    // z_hat, gamma, beta)
    var box = document.createElement("details");
    box.className = "walk"; box.open = true;
    var sum = document.createElement("summary");
    sum.textContent = "by hand: " + steps.length + " steps the tutorials compute on the way";
    box.appendChild(sum);
    stepFigures(box, s.positions, steps);
    return box;
  }
  function stepFigures(box, positions, steps) {
    // steps (walk.step_to_dict) as maps with their numbers where they fit; hovering a number, or moving to
    // it with the arrow keys, gives the step's formula
    steps.forEach(function (w) {
      var fig = document.createElement("figure"), per = { kind: "walk", shape: [w.rows.length, w.columns.length],
                                                          positions: w.rows.length === positions.length ? positions : [] };
      var m = { rows: w.values, rowLabels: w.rows, colLabels: w.columns,  // exp, sums, var: a one-sided scale
                sequential: w.values.every(function (r) { return r.every(function (v) { return v === null || v >= 0; }); }) };
      fig.appendChild(heatmap(per, m, w.title, function () { return w.formula; }));
      var cap = document.createElement("figcaption");
      cap.textContent = w.title + " = " + w.formula;
      fig.appendChild(cap); box.appendChild(fig);
    });
  }
  function drawStages(trace) {
    var box = $("stages");
    box.innerHTML = "";
    drawByHand();
    trace.stages.forEach(function (s) { box.appendChild(stageCard(trace, s)); });
    if (state.group === "after" && trace.lens && trace.lens.length) {
      var sec = document.createElement("section");
      sec.className = "stage"; sec.id = "stage-lens";
      sec.innerHTML = "<h4>logit lens</h4><p class=\"explain\">each stream stage read through the final norm and the head at the last position, as if the later blocks were not there</p>";
      var t = document.createElement("table");
      t.className = "stats";
      t.innerHTML = "<thead><tr><th>stage</th><th>token</th><th>most likely (p)</th></tr></thead>";
      var body = document.createElement("tbody");
      trace.lens.forEach(function (l) {
        var tr = document.createElement("tr");
        [l.stage, String(l.position), l.tokens.map(function (tk, i) { return JSON.stringify(tk) + " " + l.probs[i].toFixed(3); }).join("  ")]
          .forEach(function (text) { var td = document.createElement("td"); td.textContent = text; tr.appendChild(td); });
        body.appendChild(tr);
      });
      t.appendChild(body); sec.appendChild(t); box.appendChild(sec);
    }
    if (state.current) {
      var el = document.getElementById("stage-" + state.current);
      if (el) { el.classList.add("current"); }
    }
  }

  // ---- predictions -------------------------------------------------------------------------------------
  function barList(title, found, cls) {
    var box = document.createElement("div");
    box.className = "bars " + cls; box.dataset.kind = cls;
    var head = document.createElement("div");
    head.className = "bars-title";
    head.textContent = title + " (" + found.kept + " tokens kept; the " + found.ids.length + " shown hold " +
      (100 * found.shown_mass).toFixed(1) + "%)";
    box.appendChild(head);
    found.ids.forEach(function (id, i) {
      var row = document.createElement("div"), p = found.probs[i];
      row.className = "bar " + cls; row.dataset.tokenId = id; row.dataset.prob = p;
      row.title = "p = softmax(logit / T) after top-k; logit " + found.logits[i].toFixed(DECIMALS);
      row.innerHTML = '<span class="label"></span><span class="track"><span class="fill"></span></span><span class="p"></span>';
      row.querySelector(".label").textContent = JSON.stringify(found.tokens[i]);
      row.querySelector(".fill").style.width = (100 * p).toFixed(2) + "%";
      row.querySelector(".fill").style.display = "block";
      row.querySelector(".p").textContent = p.toFixed(DECIMALS);
      box.appendChild(row);
    });
    return box;
  }
  function drawBars(result) {
    var box = $("bars");
    box.innerHTML = "";
    box.appendChild(barList("the model at position " + result.position, result.plain, "plain"));
    if (result.ablated) { box.appendChild(barList("with " + state.ablate.map(describe).join(", "), result.ablated, "ablated")); }
  }
  function step(sample) {
    post("step", { sample: sample, seed: Math.floor(Math.random() * 1e9) }).then(function (r) {
      $("input").value = r.input !== undefined ? r.input : r.tokens;
      retrace(0);
    }).catch(function (e) { setStatus(e.message, true); });
  }
  $("step-greedy").addEventListener("click", function () { step(false); });
  $("step-sample").addEventListener("click", function () { step(true); });
  $("temperature").addEventListener("input", function () {
    $("temperature-value").textContent = (+$("temperature").value).toFixed(2);
    predict();
  });
  $("top-k").addEventListener("input", predict);
  function predict() {
    var serial = state.serial;
    if (!state.model.next_token) { return Promise.resolve(); }  // an encoder: its notes say why not
    return post("predict").then(function (r) { if (serial === state.serial) { drawBars(r); } })
      .catch(function (e) { setStatus(e.message, true); });
  }

  // ---- a second model side by side (a variant of the same preset, the same seed) -----------------------
  function comparable(m) {
    return m.name !== state.model.name && m.tokenizer === state.model.tokenizer &&
      m.config.vocab_size === state.model.config.vocab_size;
  }
  function drawCompareChoices() {
    var select = $("compare"), keep = state.compare;
    select.innerHTML = '<option value="">nothing</option>';
    state.models.filter(comparable).forEach(function (m) {
      var o = document.createElement("option"); o.value = m.name; o.textContent = m.name; select.appendChild(o);
    });
    state.compare = state.models.some(function (m) { return m.name === keep && comparable(m); }) ? keep : null;
    select.value = state.compare || "";
  }
  $("compare").addEventListener("change", function () { state.compare = $("compare").value || null; retrace(0); });
  function compare(serial) {
    // the compared model's stats under each stage card it shares, and its bars under ours (no ablations)
    if (!state.compare) { return Promise.resolve(); }
    var other = state.models.filter(function (m) { return m.name === state.compare; })[0];
    var shared = groupStages(state.group).filter(function (n) { return other.stages.indexOf(n) >= 0; });
    var asks = [other.next_token && state.model.next_token ? post("predict", { model: other.name, ablate: [] })
      : Promise.resolve(null)];
    if (shared.length) { asks.push(post("trace", { model: other.name, ablate: [], stages: shared })); }
    return Promise.all(asks).then(function (found) {
      if (serial !== state.serial) { return; }
      if (found[0]) { $("bars").appendChild(barList("compare: " + other.name, found[0].plain, "compared")); }
      if (!found[1]) { return; }
      found[1].stages.forEach(function (s) {
        var card = document.getElementById("stage-" + s.name);
        if (!card) { return; }
        var box = document.createElement("div"), h = document.createElement("h5");
        box.className = "compared"; box.dataset.model = other.name;
        h.textContent = "compare: " + other.name + " — " + s.explanation;
        box.appendChild(h); box.appendChild(statsTable(found[1], s)); card.appendChild(box);
      });
    });
  }

  // ---- by hand: a typed vector through a norm, an activation or the FFN (blocklab explain's steps) -------
  function typed(id) { return $(id).value.split(/[\s,]+/).filter(Boolean).map(Number); }
  function drawByHand() {
    var old = $("stage-byhand"), r = state.byhand;
    if (old) { old.remove(); }
    if (!r) { return; }
    var sec = document.createElement("section"), h = document.createElement("h4"), p = document.createElement("p");
    sec.className = "stage"; sec.id = "stage-byhand";
    h.textContent = "by hand: " + r.subject;
    var close = document.createElement("button");
    close.type = "button"; close.textContent = "close"; close.className = "close";
    close.addEventListener("click", function () { state.byhand = null; drawByHand(); });
    h.appendChild(close); sec.appendChild(h);
    p.className = "explain"; p.textContent = "the vector you typed, step by step (blocklab explain " + r.what + ")";
    sec.appendChild(p); stepFigures(sec, [], r.steps);
    $("stages").insertBefore(sec, $("stages").firstChild);
  }
  $("bh-go").addEventListener("click", function () {
    var what = $("bh-what").value, extra = { what: what, vector: typed("bh-vector") };
    if (what === "norm") {
      ["gamma", "beta"].forEach(function (k) { if ($("bh-" + k).value.trim()) { extra[k] = typed("bh-" + k); } });
    }
    if (what === "ffn") { extra.block = block() === null ? 0 : block(); }
    post("explain", extra).then(function (r) {
      state.byhand = r; drawByHand();
      setStatus("by hand: " + r.subject + ", " + r.steps.length + " steps (above the stages)");
      var first = document.querySelector("#stage-byhand canvas");
      if (first) { first.scrollIntoView({ block: "nearest" }); }
    }).catch(function (e) { setStatus(e.message, true); });
  });
  $("bh-what").addEventListener("change", function () {  // gamma and beta are a norm's
    $("bh-affine").hidden = $("bh-what").value !== "norm";
  });

  // ---- gradients ---------------------------------------------------------------------------------------
  $("grad").addEventListener("click", function () {
    if (!$("target").value.trim()) { setStatus("gradients need a target token (the box beside the input)", true); return; }
    setStatus("computing gradients…");
    var key = gradKey();
    post("gradients").then(function (r) {
      var box = $("gradients"), last = r.target.position;
      box.innerHTML = "";
      var p = document.createElement("p");
      p.className = "small"; p.textContent = "loss " + r.loss.toFixed(DECIMALS) + " for target " + JSON.stringify(r.target.token);
      box.appendChild(p);
      var t = document.createElement("table");
      t.className = "stats";
      t.innerHTML = "<caption>||dL/dx|| at each residual connection (position " + last + ")</caption>" +
        "<thead><tr><th>block</th><th>into</th><th>total</th><th>identity</th><th>branch</th></tr></thead>";
      var body = document.createElement("tbody");
      r.paths.forEach(function (layer, b) {
        Object.keys(layer).forEach(function (kind) {  // the connections the block has (simplified: the FFN's)
          var q = layer[kind], tr = document.createElement("tr");
          [String(b), kind, small(q.total[last]), small(q.identity[last]), small(q.branch[last])].forEach(function (text) {
            var td = document.createElement("td"); td.textContent = text; tr.appendChild(td);
          });
          body.appendChild(tr);
        });
      });
      t.appendChild(body); box.appendChild(t);
      var t2 = document.createElement("table");
      t2.className = "stats";
      t2.innerHTML = "<caption>||dL/d stage|| at position " + last + "</caption><thead><tr><th>stage</th><th>norm</th></tr></thead>";
      var body2 = document.createElement("tbody");
      Object.keys(r.stages).forEach(function (name) {
        var tr = document.createElement("tr");
        [name, small(r.stages[name][Math.min(last, r.stages[name].length - 1)])].forEach(function (text) {
          var td = document.createElement("td"); td.textContent = text; tr.appendChild(td);
        });
        body2.appendChild(tr);
      });
      t2.appendChild(body2); box.appendChild(t2);
      state.grads = r; r.key = key; drawDiagram();
      setStatus("gradients computed: the diagram shows each path's ||dL/dx|| at position " + last);
    }).catch(function (e) { setStatus(e.message, true); });
  });

  // ---- re-tracing as one types ---------------------------------------------------------------------------
  function stale(on) {
    // after an error the numbers below are the last input's, not what the box holds: say so and grey them
    var box = $("stages"), note = $("stale");
    box.classList.toggle("stale", on);
    if (on) { box.setAttribute("data-stale", "true"); } else { box.removeAttribute("data-stale"); }
    note.hidden = !on || !state.trace;
    if (on && state.trace) {
      note.textContent = "The numbers below are still those of the last input that traced (" +
        state.trace.input.tokens.join(" ") + "), not of the text above: fix the input to trace it.";
    }
  }
  function retrace(delay) {
    clearTimeout(state.timer);
    state.timer = setTimeout(run, delay);
  }
  function run() {
    var serial = ++state.serial, started = performance.now();
    if (state.grads && state.grads.key !== gradKey()) {  // another input, target, model or ablation: stale
      state.grads = null; $("gradients").innerHTML = ""; drawDiagram();
    }
    document.documentElement.removeAttribute("data-rendered");
    setStatus("tracing…");
    post("trace", { stages: groupStages(state.group) }).then(function (trace) {
      if (serial !== state.serial) { return; }  // a newer input is on its way
      state.trace = trace;
      stale(false);
      if (state.position !== null && state.position >= trace.input.tokens.length) { state.position = null; }
      drawTokens(trace); drawStages(trace);
      setStatus("traced " + trace.input.tokens.length + " tokens in " + Math.round(performance.now() - started) + " ms");
      return predict().then(function () { return compare(serial); }).then(function () {
        if (serial === state.serial) { document.documentElement.setAttribute("data-rendered", String(serial)); }
      });
    }).catch(function (e) {
      if (serial === state.serial) {
        setStatus(e.message, true);
        stale(true);
        document.documentElement.setAttribute("data-rendered", "error");
      }
    });
  }
  $("input").addEventListener("input", function () { retrace(DEBOUNCE_MS); });
  $("target").addEventListener("input", function () { retrace(DEBOUNCE_MS); });
  $("patch-from").addEventListener("input", function () {
    if (state.ablate.some(function (a) { return a.mode === "patch"; })) { retrace(DEBOUNCE_MS); }
  });
  document.querySelectorAll("input[name=mode]").forEach(function (r) { r.addEventListener("change", drawIntervene); });

  function drawNotes(m) {
    // what a reader must know first (random weights, no next-token head), above the numbers; an encoder's
    // next-token panel says why it is empty instead of showing bars
    var box = $("notes");
    box.innerHTML = "";
    m.notes.forEach(function (note) {
      var p = document.createElement("p"), b = document.createElement("b");
      p.className = "note"; b.textContent = "note: ";
      p.appendChild(b); p.appendChild(document.createTextNode(note)); box.appendChild(p);
    });
    $("next-token").hidden = !m.next_token;
    $("no-next-token").hidden = m.next_token;
    $("no-next-token").textContent = m.next_token ? "" : "No next-token bars: " + m.notes.join("; ") + ".";
    $("bars").innerHTML = "";
  }
  function chooseModel(name) {
    state.model = state.models.filter(function (m) { return m.name === name; })[0];
    state.ablate = []; state.position = null; state.current = null;
    if (state.group !== "input" && state.group !== "after" && block() >= state.model.config.n_layers) { state.group = "block-0"; }
    $("source").textContent = state.model.source;
    var m = state.model;
    drawNotes(m);
    $("hint").textContent = m.tokenizer ? "text in the model's vocabulary; at most " + m.max_tokens + " tokens"
      : "this model has no tokenizer: token ids separated by commas (0.." + (m.config.vocab_size - 1) + "), at most " + m.max_tokens;
    var params = new URLSearchParams(window.location.search);
    if (params.get("input") !== null && state.first) { $("input").value = params.get("input"); }
    else if (!$("input").value || !state.first) { $("input").value = m.example; }
    state.first = false;
    drawCompareChoices(); drawGroups(); drawDiagram(); drawIntervene(); retrace(0);
  }
  fetch("/api/models").then(function (r) { return r.json(); }).then(function (data) {
    state.models = data.models;
    state.first = true;
    var select = $("model");
    data.models.forEach(function (m) {
      var o = document.createElement("option"); o.value = m.name; o.textContent = m.name; select.appendChild(o);
    });
    select.addEventListener("change", function () { chooseModel(select.value); });
    var params = new URLSearchParams(window.location.search), asked = params.get("model");
    if (asked && data.models.some(function (m) { return m.name === asked; })) { select.value = asked; }
    state.compare = params.get("compare");  // a link may choose the model compared and the group shown
    if (params.get("group")) { state.group = params.get("group"); }
    chooseModel(select.value);
  }).catch(function (e) { setStatus("cannot reach the server: " + e.message, true); });
})();
