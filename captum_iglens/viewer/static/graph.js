/* captum-iglens viewer: the graph page of a probability flow (FlowGraph), in
   plain JavaScript and SVG. Registered in window.iglensPages; viewer.js runs it
   with its helpers (lib). Every string of the data is written with textContent. */
(function () {
  'use strict';
  var MARGIN = { left: 46, right: 24, top: 30, bottom: 14 };
  var MAX_WIDTH = 10, MIN_WIDTH = 0.5;  // px of the largest and of the thinnest edge
  var READS = { q: 'query', k: 'key', v: 'value' };
  var TOP_NAMED = 12;  // the heads and MLPs named on the drawing

  // The count of edges FlowGraph.prune(keep, by="share") keeps: edges come
  // sorted by |flow| (largest first); the smallest prefix whose running sum of
  // |flow| reaches keep × the total (np.searchsorted on the cumulative sums).
  function keptCount(cumulative, keep) {
    var n = cumulative.length;
    if (!n) return 0;
    var goal = keep * cumulative[n - 1] * (1 - 1e-12);
    var lo = 0, hi = n;
    while (lo < hi) {
      var mid = (lo + hi) >> 1;
      if (cumulative[mid] < goal) lo = mid + 1; else hi = mid;
    }
    return Math.min(lo + 1, n);
  }

  function count(n) { return Number(n).toLocaleString('en-US'); }
  function percent(v) { return (100 * v).toFixed(v < 0.001 ? 3 : 1) + ' %'; }

  // Per node: its in- and out-flow and edge counts over every edge of the graph.
  function nodeTotals(d) {
    var n = d.nodes.length, t = { into: [], out: [], nin: [], nout: [] };
    for (var i = 0; i < n; i++) { t.into.push(0); t.out.push(0); t.nin.push(0); t.nout.push(0); }
    var e = d.edges;
    for (var j = 0; j < e.flow.length; j++) {
      var r = d.receiver_node[e.receiver[j]];
      t.out[e.sender[j]] += e.flow[j]; t.nout[e.sender[j]]++;
      t.into[r] += e.flow[j]; t.nin[r]++;
    }
    return t;
  }

  // Pixel positions of the nodes (x, y) and of the receivers (a head's reads
  // just above, at and below it), fitted to a width and, within bounds, a height.
  function placeNodes(d, width, height) {
    var cols = 1, rows = 1;
    d.places.forEach(function (p) { cols = Math.max(cols, p[0] + 1); rows = Math.max(rows, p[1] + 1); });
    var rowHeight = Math.max(22, Math.min(56, (height - MARGIN.top - MARGIN.bottom) / (rows - 0.6)));
    var colWidth = (width - MARGIN.left - MARGIN.right) / Math.max(1, cols - 1 + 0.45);
    var y = function (row) { return MARGIN.top + row * rowHeight + (row === rows - 1 && rows > 1 ? 0.4 * rowHeight : 0); };
    var middle = (y(0) + y(rows - 1)) / 2;
    var pos = d.places.map(function (p) {
      var mlp = p[1] === rows - 1 && p[1] > 0;
      return { x: MARGIN.left + p[0] * colWidth + (mlp ? 0.45 * colWidth : 0), y: p[1] < 0 ? middle : y(p[1]) };
    });
    var reads = d.receivers.map(function (name, i) {
      var at = pos[d.receiver_node[i]], m = /<(.)>$/.exec(name);
      return { x: at.x, y: at.y + (m ? { q: -3, k: 0, v: 3 }[m[1]] : 0) };
    });
    return { pos: pos, reads: reads, cols: cols, rows: rows, colWidth: colWidth, y: y, rowHeight: rowHeight,
      height: y(rows - 1) + MARGIN.bottom + 10 };
  }

  // An S-curve between rows; an arc between nodes of one row (above it, below
  // the top row), so that the edges along a row do not lie on one another.
  function edgePath(a, b, rowHeight) {
    var dx = b.x - a.x, flat = Math.max(0, 1 - Math.abs(b.y - a.y) / rowHeight);
    var lift = flat * Math.min(0.2 * dx, 1.5 * rowHeight);
    if (Math.min(a.y, b.y) - lift < MARGIN.top) lift = -lift;
    var p = function (x, y) { return x.toFixed(1) + ',' + y.toFixed(1); };
    return 'M' + p(a.x, a.y) + 'C' + p(a.x + dx / 2, a.y - lift) + ' ' + p(a.x + dx / 2, b.y - lift) + ' ' + p(b.x, b.y);
  }

  function labels(lib, svg, d, at) {
    var heads = at.rows - 1;
    for (var r = 0; r < at.rows; r++) {
      svg.appendChild(lib.sv('text', { x: 4, y: at.y(r) + 3, 'class': 'rowlabel' },
        r === heads && heads > 0 ? 'MLP' : 'h' + r));
    }
    var every = Math.ceil(22 / at.colWidth);
    for (var c = 1; c < at.cols - 1; c++) {
      if ((c - 1) % every) continue;
      svg.appendChild(lib.sv('text', { x: MARGIN.left + c * at.colWidth, y: 12, 'text-anchor': 'middle',
        'class': 'collabel' }, String(c - 1)));
    }
    d.nodes.forEach(function (name, i) {
      if (d.places[i][1] >= 0) return;
      svg.appendChild(lib.sv('text', { x: at.pos[i].x, y: at.pos[i].y - 12, 'text-anchor': 'middle',
        'class': 'iolabel' }, name));
    });
    svg.appendChild(lib.sv('text', { x: 4, y: 12, 'class': 'rowlabel' }, 'block'));
  }

  // The names of the heads and MLPs that pass the most flow, of those drawn,
  // and of those on the route.
  function nameTop(lib, svg, d, at, totals, used) {
    var inner = d.nodes.map(function (name, k) { return k; }).filter(function (k) { return used[k] && d.places[k][1] >= 0; });
    inner.sort(function (a, b) { return Math.abs(totals.into[b]) - Math.abs(totals.into[a]); });
    var named = inner.slice(0, TOP_NAMED);
    (d.route ? d.route.nodes : []).forEach(function (k) {
      if (d.places[k][1] >= 0 && named.indexOf(k) < 0) named.push(k);
    });
    named.forEach(function (k) {
      svg.appendChild(lib.sv('text', { x: (at.pos[k].x + 6).toFixed(1), y: (at.pos[k].y - 6).toFixed(1),
        'class': 'nodelabel' }, d.nodes[k]));
    });
  }

  // The route that carries the most of Δm (d.route), whatever the slider
  // keeps: one stroke per hop, node to node, on top of the edges.
  function drawRoute(lib, svg, d, at) {
    var nodes = d.route ? d.route.nodes : [];
    for (var q = 1; q < nodes.length; q++) {
      var u = nodes[q - 1], w = nodes[q];
      svg.appendChild(lib.sv('path', { d: edgePath(at.pos[u], at.pos[w], at.rowHeight), 'class': 'route',
        'data-hop': q - 1, 'data-edge': d.nodes[u] + '->' + d.nodes[w] }));
    }
  }

  function routeLine(d, lib) {
    var r = d.route;
    return 'route carrying the most of Δm: ' + r.nodes.map(function (k) { return d.nodes[k]; }).join(' → ') +
      ', bottleneck ' + lib.fmt(r.bottleneck, true, 2) + ' (its smallest flow; drawn whatever the share kept)';
  }

  // The tooltip's lines for hop q of the route.
  function routeLines(d, lib, q) {
    var r = d.route, u = r.nodes[q], w = r.nodes[q + 1];
    var lines = [d.nodes[u] + ' → ' + d.nodes[w] + ', on the route carrying the most', 'flow ' + lib.fmt(r.flows[q], true)];
    var reads = d.receivers.filter(function (name, i) { return d.receiver_node[i] === w; });
    if (reads.length > 1) lines.push('its ' + reads.length + ' reads summed');
    if (r.flows[q] === r.bottleneck) lines.push('the bottleneck: the route\'s smallest flow');
    return lines;
  }

  function header(root, d, lib) {
    lib.header(root, d.title, d.about);
    var checks = lib.add(root, lib.h('div', 'completeness'));
    checks.id = 'checks';
    checks.textContent = 'm(prompt) = ' + lib.fmt(d.m_prompt) + ', m(base) = ' + lib.fmt(d.m_base) +
      ', Δm = ' + lib.fmt(d.delta_m, true) + ';  |Σ F(u→logits) − Δm| = ' + lib.fmt(d.completeness_error, false, 2) +
      ';  worst conservation error = ' + lib.fmt(d.conservation_error, false, 2) + ';  both over every edge;  ' + count(d.edges.flow.length) + ' edges' +
      (d.kept_into_logits === null ? '' :
        ' kept, whose flows into logits add up to ' + lib.fmt(d.kept_into_logits, true));
    var line = lib.add(root, lib.h('div', 'about tokflows'));
    lib.add(line, lib.h('b', null, 'input flow by position: '));
    var big = 0;
    d.input_flows.forEach(function (v) { big = Math.max(big, Math.abs(v || 0)); });
    d.tokens.forEach(function (t, p) {
      var chip = lib.add(line, lib.tok('span', 'chip', t));
      chip.style.background = lib.diverging(d.input_flows[p], big);
      if (lib.dark(chip.style.background)) chip.style.color = '#fff';
      chip.setAttribute('data-pos', p);
    });
  }

  // The tooltip's lines for edge i (in the order by |flow|), ranked by the
  // score drawn (rank.of[i]), or for a node (index k).
  function edgeLines(d, lib, i, rank) {
    var e = d.edges, name = d.receivers[e.receiver[i]], m = /<(.)>$/.exec(name);
    var lines = [d.nodes[e.sender[i]] + ' → ' + name, 'flow ' + lib.fmt(e.flow[i], true)];
    if (e.effect) lines.push('effect ' + lib.fmt(e.effect[i], true));
    lines.push('share of |' + rank.score + '| ' + percent(Math.abs(rank.value[i]) / rank.total),
      'rank by |' + rank.score + '| ' + count(rank.of[i] + 1) + ' of ' + count(e.flow.length));
    if (m) lines.push('read: ' + READS[m[1]]);
    return lines;
  }

  // The edges ranked by |score| ('flow' or 'effect'; ties in the order by
  // |flow|, which is the graph's order among equal flows): the order, each
  // edge's rank, the running sums of |score| and the largest.
  function ranking(d, score) {
    var value = d.edges[score], n = value.length, order = [], of = new Int32Array(n);
    for (var i = 0; i < n; i++) order.push(i);
    if (score !== 'flow') order.sort(function (a, b) { return Math.abs(value[b]) - Math.abs(value[a]) || a - b; });
    var cumulative = new Float64Array(n), sum = 0;
    order.forEach(function (i, q) { of[i] = q; sum += Math.abs(value[i]); cumulative[q] = sum; });
    return { score: score, value: value, order: order, of: of, cumulative: cumulative, total: sum || 1,
      biggest: n ? Math.abs(value[order[0]]) : 1 };
  }
  function nodeLines(d, lib, totals, k) {
    var lines = [d.nodes[k]];
    if (totals.nin[k]) lines.push('in-flow ' + lib.fmt(totals.into[k], true) + ' (' + count(totals.nin[k]) + ' edges)');
    if (totals.nout[k]) lines.push('out-flow ' + lib.fmt(totals.out[k], true) + ' (' + count(totals.nout[k]) + ' edges)');
    var through = totals.nin[k] ? totals.into[k] : totals.out[k];
    if (d.delta_m) lines.push('through-flow / Δm ' + percent(through / d.delta_m));
    return lines;
  }

  // The largest in- and out-edges of node k, over the whole graph, and where the
  // graph has them its largest flows by sender and receiver position.
  function nodePanel(panel, d, lib, k, totals) {
    panel.textContent = '';
    lib.add(panel, lib.h('h3', null, d.nodes[k] + ': ' + nodeLines(d, lib, totals, k).slice(1).join('; ')));
    var e = d.edges, lists = { 'largest in-flows': [], 'largest out-flows': [] };
    for (var i = 0; i < e.flow.length; i++) {
      var list = d.receiver_node[e.receiver[i]] === k ? lists['largest in-flows'] : e.sender[i] === k ? lists['largest out-flows'] : null;
      if (list && list.length < 8) list.push(i);
    }
    var rows = {};
    Object.keys(lists).forEach(function (title) {
      rows[title] = lists[title].map(function (i) {
        return [d.nodes[e.sender[i]] + ' → ' + d.receivers[e.receiver[i]], e.flow[i]];
      });
    });
    var p = d.pairs, at = function (s) { return '@' + s + ' ' + JSON.stringify(d.tokens[s]); };
    if (p) {
      var into = rows['largest in-flows by position'] = [], from = rows['largest out-flows by position'] = [];
      for (var j = 0; j < p.flow.length; j++) {
        var i = p.edge[j], row = [d.nodes[e.sender[i]] + at(p.s[j]) + ' → ' + d.receivers[e.receiver[i]] + at(p.t[j]), p.flow[j]];
        if (d.receiver_node[e.receiver[i]] === k && into.length < d.pairs_per_node) into.push(row);
        if (e.sender[i] === k && from.length < d.pairs_per_node) from.push(row);
      }
    }
    Object.keys(rows).forEach(function (title) {
      if (!rows[title].length) return;
      var table = lib.add(panel, lib.h('table', 'top'));
      lib.add(lib.add(table, lib.h('tr')), lib.h('td', null, title));
      rows[title].forEach(function (row) {
        var tr = lib.add(table, lib.h('tr'));
        lib.add(tr, lib.h('td', null, row[0]));
        lib.add(tr, lib.h('td', 'p', lib.fmt(row[1], true)));
      });
    });
  }

  function pageGraph(root, d, lib) {
    header(root, d, lib);
    var e = d.edges, n = e.flow.length, totals = nodeTotals(d), rank = ranking(d, 'flow');
    var state = { keep: d.keep, selected: -1 };

    var controls = lib.add(root, lib.h('div', 'controls'));
    if (e.effect) {  // rank and draw the edges by their flow or their own effect
      var by = lib.add(lib.add(controls, lib.h('label', null, 'edges by ')), lib.h('select'));
      by.id = 'score';
      ['flow', 'effect'].forEach(function (score) { lib.add(by, lib.h('option', null, score)).value = score; });
      by.addEventListener('change', function () { rank = ranking(d, by.value); draw(); });
    }
    var label = lib.add(controls, lib.h('label', null, 'share of |flow| kept '));
    var slider = lib.add(label, lib.h('input'));
    slider.type = 'range'; slider.id = 'keep'; slider.min = slider.step = String(d.keep_step); slider.max = '1';
    slider.value = String(d.keep);
    var shown = lib.add(controls, lib.h('b'));
    var note = lib.add(controls, lib.h('span'));
    note.id = 'drawn';
    var hint = lib.add(controls, lib.h('span', 'hint'));
    if (d.route) {
      var legend = lib.add(root, lib.h('div', 'routeline'));
      legend.id = 'route';
      lib.add(legend, lib.h('span', 'swatch'));
      lib.add(legend, lib.h('span', null, routeLine(d, lib)));
    }

    var main = lib.add(root, lib.h('div', 'graph'));
    var panel = lib.add(root, lib.h('div', 'panel hint', 'Click a node to list its largest in- and out-flows.'));
    panel.id = 'node';
    var tip = lib.add(document.body, lib.h('div', 'tip'));
    tip.id = 'tip';
    var svg = null, drawn = 0;

    function select(k) {
      state.selected = k;
      svg.classList.toggle('focus', k >= 0);
      Array.prototype.forEach.call(svg.querySelectorAll('path.edge'), function (p) {
        var j = Number(p.getAttribute('data-i'));
        p.classList.toggle('hl', k >= 0 && (e.sender[j] === k || d.receiver_node[e.receiver[j]] === k));
      });
      if (k >= 0) nodePanel(panel, d, lib, k, totals);
    }

    function draw() {
      var kept = keptCount(rank.cumulative, state.keep), word = '|' + rank.score + '|';
      drawn = Math.min(kept, d.max_drawn);
      label.firstChild.textContent = 'share of ' + word + ' kept ';
      shown.textContent = percent(state.keep);
      note.textContent = count(kept) + ' of ' + count(n) + ' edges carry ' +
        percent(kept ? rank.cumulative[kept - 1] / rank.total : 0) + ' of ' + word +
        (drawn < kept ? '; drawing the largest ' + count(drawn) + ', ' + count(kept - drawn) + ' hidden' : '') +
        (state.keep === d.keep && d.keep < 1 ? ' (the most that keeps ≤ ' + d.open_edges + ' edges, to open; slide for more)' : '');
      hint.textContent = 'green: ' + rank.score + ' that raises m, red: lowers it; width ∝ ' + word + ' (widest ' +
        lib.fmt(rank.biggest, false, 3) + '). Hover for numbers; click a node for its in- and out-flow.';
      var top = main.getBoundingClientRect().top + window.scrollY;
      var at = placeNodes(d, main.clientWidth, window.innerHeight - top - 12);
      if (svg) main.removeChild(svg);
      svg = lib.add(main, lib.sv('svg', { width: main.clientWidth, height: at.height.toFixed(0), id: 'graph',
        'data-kept': kept, 'data-drawn': drawn }));
      labels(lib, svg, d, at);
      var used = {};
      for (var q = drawn - 1; q >= 0; q--) {  // the largest on top
        var j = rank.order[q], v = rank.value[j], r = e.receiver[j];
        var w = Math.max(MIN_WIDTH, MAX_WIDTH * Math.abs(v) / rank.biggest);
        used[e.sender[j]] = used[d.receiver_node[r]] = true;
        svg.appendChild(lib.sv('path', { d: edgePath(at.pos[e.sender[j]], at.reads[r], at.rowHeight), 'stroke-width': w.toFixed(2),
          'class': 'edge ' + (v >= 0 ? 'up' : 'down'), 'data-i': j,
          'data-edge': d.nodes[e.sender[j]] + '->' + d.receivers[r] }));
      }
      drawRoute(lib, svg, d, at);
      var scale = 0;
      d.nodes.forEach(function (name, k) { if (d.places[k][1] >= 0) scale = Math.max(scale, Math.abs(totals.into[k])); });
      d.nodes.forEach(function (name, k) {
        var io = d.places[k][1] < 0;
        svg.appendChild(lib.sv('circle', { cx: at.pos[k].x.toFixed(1), cy: at.pos[k].y.toFixed(1), r: io ? 7 : 4.5,
          'class': 'node' + (used[k] ? '' : ' idle') + (io ? ' io' : ''), 'data-node': name, 'data-k': k,
          fill: io ? '#555' : lib.diverging(totals.into[k], scale) }));
      });
      nameTop(lib, svg, d, at, totals, used);
      if (state.selected >= 0) select(state.selected);
    }

    function showTip(ev, lines) {
      tip.textContent = '';
      lines.forEach(function (line, i) { lib.add(tip, lib.h('div', i ? null : 'tiphead', line)); });
      tip.style.display = 'block';
      var x = Math.min(ev.clientX + 14, window.innerWidth - tip.offsetWidth - 4);
      var y = ev.clientY + 14 + tip.offsetHeight > window.innerHeight ? ev.clientY - tip.offsetHeight - 8 : ev.clientY + 14;
      tip.style.left = Math.max(0, x) + 'px'; tip.style.top = Math.max(0, y) + 'px';
    }
    root.addEventListener('mouseover', function (ev) {
      var t = ev.target;
      if (t.hasAttribute && t.hasAttribute('data-i')) showTip(ev, edgeLines(d, lib, Number(t.getAttribute('data-i')), rank));
      else if (t.hasAttribute && t.hasAttribute('data-hop')) showTip(ev, routeLines(d, lib, Number(t.getAttribute('data-hop'))));
      else if (t.hasAttribute && t.hasAttribute('data-k')) showTip(ev, nodeLines(d, lib, totals, Number(t.getAttribute('data-k'))));
      else if (t.hasAttribute && t.hasAttribute('data-pos')) {
        var p = Number(t.getAttribute('data-pos'));
        showTip(ev, ['position ' + p + ': ' + lib.visible(d.tokens[p]), 'input flow ' + lib.fmt(d.input_flows[p], true)]);
      } else tip.style.display = 'none';
    });
    main.addEventListener('click', function (ev) {
      var k = ev.target.hasAttribute('data-k') ? Number(ev.target.getAttribute('data-k')) : -1;
      if (k < 0 && (ev.target.hasAttribute('data-i') || ev.target.hasAttribute('data-hop'))) return;  // an edge: the selection stays
      select(k === state.selected ? -1 : k);
      if (state.selected < 0) panel.textContent = 'Click a node to list its largest in- and out-flows.';
    });
    slider.addEventListener('input', function () { state.keep = Number(slider.value); draw(); });
    var pending = null;
    window.addEventListener('resize', function () { clearTimeout(pending); pending = setTimeout(draw, 150); });
    draw();
  }

  window.iglensPages = window.iglensPages || {};
  window.iglensPages.graph = pageGraph;
}());
