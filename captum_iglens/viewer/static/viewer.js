/* captum-iglens viewer: plain JavaScript and SVG, no library, no network.
   Every string of the data is written with textContent (never as markup). */
(function () {
  'use strict';
  var SVGNS = 'http://www.w3.org/2000/svg';
  var DATA = JSON.parse(document.getElementById('iglens-data').textContent);
  // Captum's red-white-green, as the PNG heatmaps (matplotlib's 'red', 'green').
  var WHITE = [255, 255, 255], RED = [255, 0, 0], GREEN = [0, 128, 0];
  var redraw = null, pending = null;  // the map on show, redrawn when the window resizes
  window.addEventListener('resize', function () {
    clearTimeout(pending);
    pending = setTimeout(function () { if (redraw) redraw(); }, 150);
  });
  var PURPLE = [84, 39, 143];
  // Above this many columns, cells are coloured only (no top-1 token text).
  var MAX_TEXT_COLUMNS = 64;

  // ------------------------------------------------------------------ helpers
  function h(tag, cls, text) {
    var e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined && text !== null) e.textContent = String(text);
    return e;
  }
  function add(parent, child) { parent.appendChild(child); return child; }
  // A token as the terminal table shows it: what renders invisibly written as
  // Python escapes it (newline \n, tab \t, other control and format characters
  // and unusual spaces \x0b, \u200b), a token of plain spaces
  // as one '␣' per space, the empty token as '∅'.
  var INVISIBLE = /[\p{C}\p{Z}]/u, NAMED = { '\n': '\\n', '\t': '\\t', '\r': '\\r' };
  function visible(text) {
    text = String(text);
    if (text === '') return '∅';
    if (/^ +$/.test(text)) return text.replace(/ /g, '␣');
    return Array.from(text).map(function (c) {
      if (c === ' ' || !INVISIBLE.test(c)) return c;
      if (NAMED[c]) return NAMED[c];
      var n = c.codePointAt(0), hex = n.toString(16);
      if (n < 0x100) return '\\x' + ('0' + hex).slice(-2);
      if (n < 0x10000) return '\\u' + ('000' + hex).slice(-4);
      return '\\U' + ('0000000' + hex).slice(-8);
    }).join('');
  }
  // An element holding a token's visible text; class 'esc' where it was escaped.
  function tok(tag, cls, text) {
    var shown = visible(text);
    return h(tag, (cls || '') + (shown !== String(text) ? ' esc' : ''), shown);
  }
  function sv(tag, attrs, text) {
    var e = document.createElementNS(SVGNS, tag);
    Object.keys(attrs || {}).forEach(function (k) { e.setAttribute(k, attrs[k]); });
    if (text !== undefined) e.textContent = String(text);
    return e;
  }
  function fmt(v, signed, digits) {
    if (v === null || v === undefined) return '–';
    var t = v === 0 ? '0' : Number(v).toPrecision(digits || 4);
    return signed && v > 0 ? '+' + t : t;
  }
  function mix(a, b, t) {
    return 'rgb(' + [0, 1, 2].map(function (i) {
      return Math.round(a[i] + (b[i] - a[i]) * t);
    }).join(',') + ')';
  }
  // Whether text on the CSS colour 'rgb(r, g, b)' needs light ink.
  function dark(colour) {
    var c = (colour.match(/\d+/g) || [255, 255, 255]).map(Number);
    return 0.299 * c[0] + 0.587 * c[1] + 0.114 * c[2] < 150;
  }
  // Colour intensity grows with sqrt(|v| / scale): small credits stay visible.
  function diverging(v, scale) {
    if (!scale || !v) return mix(WHITE, WHITE, 0);
    var t = Math.sqrt(Math.min(1, Math.abs(v) / scale));
    return mix(WHITE, v > 0 ? GREEN : RED, t);
  }
  function sequential(v, scale, to) {
    if (!scale || !v) return mix(WHITE, WHITE, 0);
    return mix(WHITE, to, Math.sqrt(Math.min(1, Math.abs(v) / scale)));
  }
  function legend(kind, scale, what) {
    var box = h('span', 'legend');
    var bar = h('span', 'bar');
    var stops = kind === 'div'
      ? [diverging(-scale, scale), 'rgb(255,255,255)', diverging(scale, scale)]
      : ['rgb(255,255,255)', sequential(scale, scale, kind === 'lens' ? GREEN : PURPLE)];
    bar.style.background = 'linear-gradient(to right,' + stops.join(',') + ')';
    add(box, h('span', null, kind === 'div' ? fmt(-scale, true, 2) : '0'));
    add(box, bar);
    add(box, h('span', null, fmt(scale, kind === 'div', 2)));
    add(box, h('span', null, what + ' (colour ∝ √|value|)'));
    return box;
  }
  function kv(table, key, field) {
    var tr = add(table, h('tr'));
    add(tr, h('td', null, key));
    var td = add(tr, h('td', 'v'));
    td.setAttribute('data-field', field);
    return td;
  }
  // The grid on the left, panels on the right; the first panel (#info) holds a
  // key-value table of the hovered cell, after an optional title and hint.
  function cellLayout(parent, title, hint) {
    var layout = add(parent, h('div', 'layout'));
    var parts = { main: add(layout, h('div', 'main')), side: add(layout, h('div', 'side')) };
    var info = add(parts.side, h('div', 'panel'));
    info.id = 'info';
    if (title) add(info, h('h3', null, title));
    if (hint) parts.hint = add(info, h('div', 'hint', hint));
    parts.info = info;
    parts.kvt = add(info, h('table', 'kv'));
    return parts;
  }
  function header(root, title, about) {
    add(root, h('h1', null, title));
    Object.keys(about || {}).forEach(function (key) {
      var line = add(root, h('div', 'about'));
      add(line, h('b', null, key + ': '));
      add(line, tok('span', null, about[key]));  // escaped as the rows are
    });
  }
  function radio(parent, name, options, value, onChange) {
    options.forEach(function (opt) {
      var label = add(parent, h('label'));
      var input = add(label, h('input'));
      input.type = 'radio'; input.name = name; input.value = opt[0];
      input.checked = opt[0] === value;
      input.addEventListener('change', function () { onChange(opt[0]); });
      add(label, document.createTextNode(' ' + opt[1]));
    });
  }
  // The n largest |values| as (value, index), ignoring those under floor.
  function topBars(values, n, floor) {
    return values.map(function (v, i) { return [v, i]; })
      .filter(function (p) { return p[0] !== null && Math.abs(p[0]) > floor; })
      .sort(function (a, b) { return Math.abs(b[0]) - Math.abs(a[0]); }).slice(0, n);
  }

  // One table per group of tokens: a row per method, a column per metric, each
  // cell 'mean [lo, hi] n=...' (summary[group][method][metric]).
  function statsTables(root, summary, heading) {
    var metrics = [];
    Object.keys(summary).forEach(function (g) {
      Object.keys(summary[g]).forEach(function (m) {
        Object.keys(summary[g][m]).forEach(function (k) { if (metrics.indexOf(k) < 0) metrics.push(k); });
      });
    });
    Object.keys(summary).forEach(function (g) {
      add(root, h('h2', null, heading + g));
      var table = add(root, h('table', 'stats'));
      var tr = add(table, h('tr'));
      add(tr, h('th', null, 'method'));
      metrics.forEach(function (k) { add(tr, h('th', null, k)); });
      Object.keys(summary[g]).forEach(function (m) {
        var row = add(table, h('tr'));
        add(row, h('td', null, m));
        metrics.forEach(function (k) {
          var s = summary[g][m][k];
          add(row, h('td', 'v', s && s.n ? fmt(s.mean, false, 3) + ' [' + fmt(s.lo, false, 3) + ', ' + fmt(s.hi, false, 3) + '] n=' + s.n : '–'));
        });
      });
    });
  }

  // ------------------------------------------------------------------ chart
  /* A small SVG chart: x = labels, optional bars from 0, optional lines. */
  // An axis tick: two significant digits, in exponent form below 1e-3
  // (0.00044 as 4.4e-4), so that a tick stays short.
  function tick(v) {
    return v !== 0 && Math.abs(v) < 1e-3 ? Number(v).toExponential(1) : fmt(v, false, 2);
  }
  function chart(opts) {
    var W = opts.width || 330, H = opts.height || 200, L = 40, R = 8, T = 10, B = 34;
    // The x labels are drawn at -35 degrees, ending at their tick: the bottom
    // margin fits the longest (about 6px a character at 10px), the left one the
    // first, and the chart grows by what the bottom margin adds.
    var chars = function (label) { return String(label).length; };
    var longestLabel = Math.max.apply(null, [0].concat(opts.labels.map(chars)));
    var grow = Math.max(0, Math.ceil(14 + 6 * 0.58 * longestLabel) - B);
    B += grow; H += grow;
    L = Math.max(L, Math.ceil(6 * 0.82 * chars(opts.labels[0] || '')) + 4);
    var n = opts.labels.length, all = [0];
    (opts.series || []).forEach(function (s) { all = all.concat(s.values); });
    if (opts.bars) all = all.concat(opts.bars);
    all = all.filter(function (v) { return v !== null && v !== undefined; });
    var lo = all.reduce(function (a, v) { return Math.min(a, v); });
    var hi = all.reduce(function (a, v) { return Math.max(a, v); });
    if (hi - lo < 1e-9) hi = lo + 1;
    var pad = (hi - lo) * 0.05; lo -= lo < 0 ? pad : 0; hi += pad;
    var ticks = [lo, 0, hi].map(tick);
    // The left margin fits the longest tick (about 6.5px a character at 11px).
    L = Math.max(L, 8 + Math.ceil(6.5 * Math.max.apply(null, ticks.map(chars))));
    var x = function (i) { return L + (n <= 1 ? 0 : i * (W - L - R) / (n - 1)); };
    var y = function (v) { return T + (hi - v) * (H - T - B) / (hi - lo); };
    var root = sv('svg', { width: W, height: H, viewBox: '0 0 ' + W + ' ' + H });
    add(root, sv('line', { x1: L, x2: W - R, y1: y(0), y2: y(0), 'class': 'axis' }));
    add(root, sv('line', { x1: L, x2: L, y1: T, y2: H - B, 'class': 'axis' }));
    // 0, then the ends where they do not overlap it.
    [1, 0, 2].forEach(function (i) {
      var v = [lo, 0, hi][i];
      if (i !== 1 && Math.abs(y(v) - y(0)) < 11) return;
      add(root, sv('text', { x: L - 3, y: y(v) + 3, 'text-anchor': 'end' }, ticks[i]));
    });
    var bw = Math.max(1, Math.min(14, (W - L - R) / Math.max(n, 1) * 0.7));
    if (opts.bars) {
      opts.bars.forEach(function (v, i) {
        if (v === null || v === undefined) return;
        var top = Math.min(y(v), y(0)), ht = Math.max(0.5, Math.abs(y(v) - y(0)));
        var r = add(root, sv('rect', {
          x: x(i) - bw / 2, y: top, width: bw, height: ht, 'class': v >= 0 ? 'up' : 'down'
        }));
        add(r, sv('title', {}, opts.labels[i] + ': ' + fmt(v, opts.signed)));
      });
    }
    (opts.series || []).forEach(function (s) {
      var pts = s.values.map(function (v, i) { return x(i).toFixed(1) + ',' + y(v).toFixed(1); });
      add(root, sv('polyline', { points: pts.join(' '), 'class': s.cls }));
    });
    // Every label of a step of `every`, and the last; one closer to the last
    // than a slanted line needs (11px at 35 degrees: 20px apart) gives way.
    var every = Math.max(1, Math.ceil(n / 8));
    opts.labels.forEach(function (label, i) {
      if (i !== n - 1 && (i % every || x(n - 1) - x(i) < 20)) return;
      add(root, sv('text', {
        x: x(i), y: H - B + 12, 'text-anchor': 'end',
        transform: 'rotate(-35 ' + x(i) + ' ' + (H - B + 12) + ')'
      }, label));
    });
    var lx = L + 4;
    (opts.series || []).forEach(function (s) {
      add(root, sv('line', { x1: lx, x2: lx + 16, y1: T + 4, y2: T + 4, 'class': s.cls }));
      add(root, sv('text', { x: lx + 20, y: T + 7 }, s.name));
      lx += 30 + 6 * s.name.length;
    });
    return root;
  }

  // ------------------------------------------------------------------ columns
  /* The page's column groups (made in Python, see viewer/_columns.py): the
     parts of one segment (heads and bias, neurons and bias, experts, a
     block's per-source parts) fold into one column: credit summed, lens after
     the last member. */
  // Above this many columns, 'unfold all' is not offered (unfold a block).
  var MAX_UNFOLD_ALL = 2000;
  function displayColumns(groups, folded) {
    var cols = [];
    groups.forEach(function (g, gi) {
      if (g.foldable && folded[gi]) {
        cols.push({ members: g.members, label: g.name + ' ▸' + g.members.length, group: gi, head: 'group' });
      } else {
        g.members.forEach(function (m, k) {
          cols.push({ members: [m], label: null, group: g.foldable ? gi : -1, head: g.foldable ? 'member' : '', at: k });
        });
      }
    });
    return cols;
  }

  // ------------------------------------------------------------------ map view
  /* The answer tokens x layers map of one sequence, with its hover panel and
     the trajectory of a clicked token. */
  // Which columns show their name: every one at least 12px wide, and a
  // narrower one where its name (about 14px across, drawn over its unnamed
  // neighbours) keeps clear of the last name shown and of the next wide
  // column's, so that no two names overlap.
  function namedColumns(widths) {
    var room = 14, lefts = [], at = 0, nextWide = [], wide = Infinity, last = -Infinity;
    widths.forEach(function (w) { lefts.push(at); at += w + 1; });  // 1px grid gap
    for (var i = widths.length - 1; i >= 0; i--) {
      nextWide[i] = wide;
      if (widths[i] >= 12) wide = lefts[i];
    }
    return widths.map(function (w, i) {
      var show = w >= 12 || (lefts[i] - last >= room && nextWide[i] - lefts[i] >= room);
      if (show) last = lefts[i];
      return show;
    });
  }
  function renderMap(root, layers, groups, rows, vocab, sources, trajectory) {
    var folded = groups.map(function (g) { return g.folded; });
    var foldable = groups.some(function (g) { return g.foldable; });
    var state = { view: 'credit', absolute: false, row: -1 };
    var controls = add(root, h('div', 'controls'));
    // Under a learned readout per layer, each credit is a block part plus a
    // lens-change part; either can be shown alone.
    var learned = rows.length > 0 && !!rows[0].change;
    var views = [['credit', 'credit']];
    if (learned) views.push(['block', 'block part'], ['change', 'lens-change part']);
    views.push(['lens', 'lens level f(h_L)']);
    radio(controls, 'view' + Math.random(), views, 'credit',
      function (v) { state.view = v; draw(); });
    var absLabel = add(controls, h('label'));
    var abs = add(absLabel, h('input'));
    abs.type = 'checkbox'; abs.id = 'absolute';
    abs.addEventListener('change', function () { state.absolute = abs.checked; draw(); });
    add(absLabel, document.createTextNode(' absolute |credit|'));
    if (foldable) {
      if (layers.length <= MAX_UNFOLD_ALL) {
        var unfold = add(controls, h('button', null, 'unfold all'));
        unfold.addEventListener('click', function () { folded = folded.map(function () { return false; }); draw(); });
      }
      var fold = add(controls, h('button', null, 'fold per block'));
      fold.addEventListener('click', function () { folded = groups.map(function (g) { return g.foldable; }); draw(); });
    }
    var legendSlot = add(controls, h('span'));
    add(root, h('div', 'hint', rows.length + ' tokens × ' + layers.length +
      (foldable ? ' columns in ' + groups.length + ' groups; click a folded group\'s head (▸) to unfold it, ' +
        'a member\'s head to fold it back' : ' layers') + (rows.length && rows[0].top ? '; each cell shows the layer\'s top-1 token, bold over a ' +
      'blue bar where it is the target' : '') + '. Hover a cell for its numbers; click a token for its trajectory. ' +
      'A black frame marks the onset (the layer by which half of the token\'s |credit| is given).'));
    var parts = cellLayout(root, 'Cell', 'Hover a cell of the map.');
    var main = parts.main, side = parts.side, info = parts.info, kvt = parts.kvt;
    var infoHint = parts.hint;
    kvt.style.display = 'none';  // until a cell is hovered
    var f = {
      token: kv(kvt, 'token', 'token'), layer: kv(kvt, 'layer', 'layer'),
      credit: kv(kvt, 'credit', 'credit'), error: kv(kvt, 'credit error (bound)', 'error'),
      change: kv(kvt, 'lens-change part', 'change'),
      before: kv(kvt, 'lens before', 'lens_before'),
      after: kv(kvt, 'lens after', 'lens_after'), entropy: kv(kvt, 'entropy (nats)', 'entropy'),
      kl: kv(kvt, 'KL (nats)', 'kl'), rank: kv(kvt, 'target rank', 'rank')
    };
    if (!learned) f.change.parentNode.style.display = 'none';
    var bounded = rows.length > 0 && !!rows[0].error;
    if (!bounded) f.error.parentNode.style.display = 'none';
    var topTable = add(info, h('table', 'top'));
    topTable.id = 'top-tokens';
    var traj = add(side, h('div', 'panel'));
    traj.id = 'trajectory';
    add(traj, h('h3', null, 'Trajectory'));
    var trajBody = add(traj, h('div', 'hint', 'Click a token (a row label) to draw its trajectory.'));
    var cols = [], grid = null;
    var showSources = sources ? sourcePanel(root, sources) : null;

    // A column's members summed: a collapsed group's parts add up.
    function total(members, at) {
      var s = 0;
      members.forEach(function (m) { s += at(m); });
      return s;
    }
    function value(row, col) {
      if (state.view === 'lens') return row.lens[col.members[col.members.length - 1]];
      var s = total(col.members, function (m) {
        if (state.view === 'change') return row.change[m];
        return state.view === 'block' ? row.credit[m] - row.change[m] : row.credit[m];
      });
      return state.absolute ? Math.abs(s) : s;
    }
    function draw() {
      cols = displayColumns(groups, folded);
      var scale = 0;
      rows.forEach(function (row) { cols.forEach(function (c) { scale = Math.max(scale, Math.abs(value(row, c))); }); });
      if (state.view === 'lens') scale = 1;
      var kind = state.view === 'lens' ? 'lens' : (state.absolute ? 'abs' : 'div');
      legendSlot.textContent = '';
      add(legendSlot, legend(kind, scale, state.view === 'lens' ? 'probability' : 'credit'));
      var maxLen = 4;
      rows.forEach(function (r) { maxLen = Math.max(maxLen, r.token.length + String(r.pos).length + 1); });
      var labelW = Math.min(220, 16 + 7.3 * maxLen);
      var avail = Math.max(300, main.clientWidth - labelW - 8);
      // With views, each cell shows its layer's top-1 token, as in the classic
      // logit-lens grid; cells wide enough to read it (the grid scrolls).
      var text = rows.length > 0 && !!rows[0].top && cols.length <= MAX_TEXT_COLUMNS;
      if (text) avail -= 16;  // the grid's own vertical scroll bar
      var cw = text ? Math.max(38, Math.min(64, Math.floor(avail / cols.length) - 1))
        : Math.max(4, Math.min(26, Math.floor(avail / cols.length) - 1));
      if (grid) main.removeChild(grid);
      grid = add(main, h('div', 'grid' + (text ? ' text' : '')));
      grid.id = 'map';
      main.classList.toggle('scroll', text);
      // Under 12px wide, the members of an unfolded group are named one in
      // every few, each name drawn over its unnamed neighbours; the other
      // columns keep a width their names fit.
      var thin = cw < 12;
      var widths = cols.map(function (c) { return thin && c.head !== 'member' ? 16 : cw; });
      grid.style.gridTemplateColumns = labelW + 'px ' + widths.join('px ') + 'px';
      add(grid, h('div', 'corner'));
      var names = cols.map(function (c) { return c.label || layers[c.members[0]]; });
      var longest = names.reduce(function (n, name) { return Math.max(n, name.length); }, 0);
      var headH = text ? 18 : Math.max(72, Math.min(140, Math.ceil(6.5 * longest) + 6));
      var named = namedColumns(widths);
      cols.forEach(function (c, ci) {
        var name = names[ci], narrow = widths[ci] < 12;
        var showText = named[ci];
        var head = add(grid, h('div', 'colhead' + (c.head ? ' ' + c.head : '') + (narrow ? ' thin' : ''), showText ? name : ''));
        head.setAttribute('title', name + (c.head ? ' (click to ' + (c.head === 'group' ? 'unfold' : 'fold') + ')' : ''));
        head.style.height = headH + 'px';
        if (c.head) {
          head.addEventListener('click', function () { folded[c.group] = c.head !== 'group'; draw(); });
        }
      });
      rows.forEach(function (row, ri) {
        var label = add(grid, h('div', 'rowhead' + (ri === state.row ? ' selected' : '')));
        label.setAttribute('data-row', ri);
        add(label, h('span', 'pos', row.pos + ' '));
        add(label, tok('span', 'tok', row.token));
        label.setAttribute('title', row.token);
        var onset = row.onset;
        cols.forEach(function (c, ci) {
          var v = value(row, c);
          var cell = h('div', 'cell');
          if (onset >= 0 && c.members.indexOf(onset) >= 0) cell.className = 'cell onset';
          cell.style.background = kind === 'div' ? diverging(v, scale)
            : sequential(v, scale, kind === 'lens' ? GREEN : PURPLE);
          if (text) topCell(cell, row, c.members[c.members.length - 1]);
          cell.setAttribute('data-row', ri);
          cell.setAttribute('data-col', ci);
          grid.appendChild(cell);
        });
      });
      if (state.row >= 0) showRow(state.row);  // its trajectory over these columns
    }
    // The top-1 token of layer j (after a folded group: its last member), bold
    // over a blue bar where it is the target; ink that reads on the colour.
    function topCell(cell, row, j) {
      var text = vocab[row.top[j][0]];
      var hit = row.rank ? row.rank[j] === 1 : text === row.token;
      var shown = visible(text);
      cell.textContent = shown;
      if (hit) cell.classList.add('hit');
      if (shown !== text) cell.classList.add('esc');
      if (dark(cell.style.background)) cell.style.color = '#fff';
    }
    function showCell(ri, ci) {
      var row = rows[ri], c = cols[ci], first = c.members[0], last = c.members[c.members.length - 1];
      var credit = total(c.members, function (m) { return row.credit[m]; });
      infoHint.textContent = '';
      kvt.style.display = '';
      f.token.textContent = visible(row.token);
      f.layer.textContent = c.head === 'group'
        ? groups[c.group].name + ' (' + groups[c.group].what + ', summed)' : layers[first];
      f.credit.textContent = fmt(credit, true);
      if (learned) f.change.textContent = fmt(total(c.members, function (m) { return row.change[m]; }), true);
      if (bounded) f.error.textContent = '± ' + fmt(total(c.members, function (m) { return row.error[m]; }));
      f.before.textContent = fmt(first > 0 ? row.lens[first - 1] : row.base);
      f.after.textContent = fmt(row.lens[last]);
      f.entropy.textContent = row.entropy ? fmt(row.entropy[last]) : '–';
      f.kl.textContent = row.kl ? fmt(row.kl[last]) : '–';
      f.rank.textContent = row.rank ? String(row.rank[last]) : '–';
      topTable.textContent = '';
      if (row.top) {
        row.top[last].forEach(function (vi, i) {
          var p = row.topp[last][i], text = vocab[vi];
          var tr = add(topTable, h('tr', text === row.token ? 'target' : null));
          add(tr, tok('td', 'tok', text));
          add(tr, h('td', 'p', fmt(p)));
          var bar = add(add(tr, h('td')), h('span', 'pbar'));
          bar.style.width = Math.round(80 * Math.max(0, Math.min(1, p))) + 'px';
        });
      }
    }
    function showRow(ri) {
      state.row = ri;
      Array.prototype.forEach.call(grid.querySelectorAll('.rowhead'), function (e) {
        e.classList.toggle('selected', Number(e.getAttribute('data-row')) === ri);
      });
      // Drawn over the columns on show: a folded group is one bar.
      var row = rows[ri], cum = [0], s = 0;
      var credits = cols.map(function (c) { return total(c.members, function (m) { return row.credit[m]; }); });
      credits.forEach(function (v) { s += v; cum.push(s); });
      trajBody.textContent = '';
      trajBody.className = '';
      var title = add(trajBody, h('div'));
      add(title, document.createTextNode('token '));
      add(title, tok('b', 'tok', row.token));
      add(title, document.createTextNode(' at position ' + row.pos + ', p_model = ' + fmt(row.prob)));
      add(trajBody, chart({
        labels: ['h_base'].concat(cols.map(function (c) { return c.label || layers[c.members[0]]; })),
        bars: [null].concat(credits), signed: true,
        series: [
          { cls: 'lens', values: [row.base].concat(cols.map(function (c) { return row.lens[c.members[c.members.length - 1]]; })),
            name: 'lens level' },
          { cls: 'cumulative', values: cum, name: 'cumulative credit' }
        ]
      }));
      var big = 0;
      row.credit.forEach(function (v) { big = Math.max(big, Math.abs(v)); });
      var built = topBars(row.credit.map(function (v) { return v > 0 ? v : null; }), 3, 1e-3 * big);
      var back = topBars(row.credit.map(function (v) { return v < 0 ? v : null; }), 3, 1e-3 * big);
      var describe = function (list) {
        return list.length ? list.map(function (p) { return layers[p[1]] + ' ' + fmt(p[0], true, 3); }).join(', ') : 'none';
      };
      // What the two lines are depends on the path; the page says it, by path.
      var caption = add(trajBody, h('div', 'hint', trajectory + '; f(h_base) = ' + fmt(row.base)));
      caption.id = 'trajectory-caption';
      add(trajBody, h('div', 'hint', 'built at: ' + describe(built)));
      add(trajBody, h('div', 'hint', 'given back at: ' + describe(back)));
      var line = add(trajBody, h('div', 'completeness'));
      line.id = 'completeness';
      line.textContent = 'Σ = ' + fmt(row.sum, true) + '   Δp = ' + fmt(row.dp, true) +
        '   |Σ − Δp| = ' + fmt(row.resid, false, 3);
      if (showSources) showSources(row);
    }
    main.addEventListener('mouseover', function (ev) {
      var t = ev.target;
      if (!t.classList || !t.classList.contains('cell')) return;
      Array.prototype.forEach.call(grid.querySelectorAll('.cell.hover'), function (e) { e.classList.remove('hover'); });
      t.classList.add('hover');
      showCell(Number(t.getAttribute('data-row')), Number(t.getAttribute('data-col')));
    });
    main.addEventListener('click', function (ev) {
      var t = ev.target.closest ? ev.target.closest('[data-row]') : null;
      if (t) showRow(Number(t.getAttribute('data-row')));
    });
    draw();
    redraw = draw;
    if (rows.length) showRow(0);  // the first token's trajectory, on open
  }

  // ------------------------------------------------------------------ sources
  /* The panel of a sequence's source-token map (src: page_data()["sources"][b]);
     returns show(row), which draws the clicked token's layer x source map
     (sources down, blocks across, then its bias and MLP rows) and its
     strongest routes source -> block/head -> answer as a flow. */
  var N_ROUTES = 8;
  function sourcePanel(root, src) {
    var box = add(root, h('div', 'panel'));
    box.id = 'sources';
    add(box, h('h3', null, 'Where the probability came from: source tokens × blocks'));
    var body = add(box, h('div', 'hint', 'Click a token for its source map.'));
    var info = h('table', 'kv');
    info.id = 'source-info';
    var f = { source: kv(info, 'source', 'source'), block: kv(info, 'block', 'block'),
      credit: kv(info, 'credit (probability)', 'credit') };
    function label(j) {
      return j + ' ' + (src.tokens ? visible(src.tokens[j]) : 's' + j);
    }
    function tell(j, block, v) {
      f.source.textContent = j === null ? '–' : label(j);
      f.block.textContent = block;
      f.credit.textContent = fmt(v, true, 7);
    }
    return function show(row) {
      var p = src.positions.indexOf(row.pos);
      body.textContent = '';
      body.className = '';
      if (p < 0) { add(body, h('div', 'hint', 'No source map for this token.')); return; }
      var credits = src.credits[p], k = src.blocks.length;
      var T = Math.min(credits.length ? credits[0].length : 0, row.pos + 1);
      var title = add(body, h('div'));
      add(title, document.createTextNode('token '));
      add(title, tok('b', 'tok', row.token));
      add(title, document.createTextNode(' at position ' + row.pos +
        ': the credit of each block\'s attention from each earlier token (heads summed), ' +
        'then each block\'s attention bias and MLP. Hover a cell for its exact credit.'));
      var wrap = add(body, h('div', 'srcwrap'));
      var left = add(wrap, h('div', 'srcmap'));
      var right = add(wrap, h('div', 'srcside'));
      add(right, info);
      tell(null, '–', null);
      // Coloured on the sources' own scale (an MLP's credit would wash them
      // out); the bias and MLP rows saturate beyond it.
      var scale = 0;
      for (var l = 0; l < k; l++) {
        for (var j = 0; j < T; j++) scale = Math.max(scale, Math.abs(credits[l][j]));
      }
      add(left, legend('div', scale, 'credit from a source'));
      var grid = add(left, h('div', 'grid'));
      grid.id = 'source-map';
      grid.style.gridTemplateColumns = 'minmax(90px, max-content) repeat(' + k + ', 16px) 64px';
      add(grid, h('div'));
      src.blocks.forEach(function (b) { add(grid, h('div', 'colhead', b)).style.height = '36px'; });
      add(grid, h('div', 'num head', 'Σ blocks'));
      // One row: a label, a cell per block (source j, or a named part), its sum.
      function line(head, values, j, what) {
        add(grid, head);
        var total = 0;
        values.forEach(function (v, l) {
          total += v;
          var cell = add(grid, h('div', 'cell'));
          cell.style.background = diverging(v, scale);
          cell.setAttribute('data-source', j === null ? '' : j);
          cell.setAttribute('data-block', l);
          cell.setAttribute('data-what', what);
          cell.setAttribute('data-credit', v);
        });
        add(grid, h('div', 'num', fmt(total, true, 3)));
      }
      for (var s = 0; s < T; s++) {
        var head = h('div', 'rowhead');
        add(head, h('span', 'pos', s + ' '));
        add(head, src.tokens ? tok('span', 'tok', src.tokens[s]) : h('span', 'tok', 's' + s));
        line(head, credits.map(function (perBlock) { return perBlock[s]; }), s, '');
      }
      line(h('div', 'rowhead', 'attention bias'), src.bias[p], null, 'attention bias');
      line(h('div', 'rowhead', 'MLP'), src.mlp[p], null, 'MLP');
      grid.addEventListener('mouseover', function (ev) {
        var t = ev.target;
        if (!t.classList || !t.classList.contains('cell')) return;
        var j = t.getAttribute('data-source'), l = Number(t.getAttribute('data-block'));
        tell(j === '' ? null : Number(j), src.blocks[l] + (j === '' ? ' ' + t.getAttribute('data-what') : ''),
          Number(t.getAttribute('data-credit')));
      });
      var sum = 0;
      credits.forEach(function (r) { r.forEach(function (v) { sum += v; }); });
      src.bias[p].forEach(function (v) { sum += v; });
      src.mlp[p].forEach(function (v) { sum += v; });
      sum += src.input[p];
      var check = add(left, h('div', 'completeness'));
      check.id = 'source-sum';
      check.textContent = 'Σ sources + bias + MLP + input = ' + fmt(sum, true) + '   Δp = ' + fmt(row.dp, true);
      add(right, h('h3', null, 'Strongest routes'));
      add(right, flow(routes(src, p, T), row, label, tell));
    };
  }
  // The N_ROUTES largest |credit| (source, block, head) of answer token p.
  function routes(src, p, T) {
    var found = [];
    src.blocks.forEach(function (b, l) {
      if (src.heads) {
        src.heads[p][l].forEach(function (perSource, hd) {
          for (var j = 0; j < T; j++) if (perSource[j]) found.push({ j: j, l: l, h: hd, v: perSource[j] });
        });
      } else {
        for (var j = 0; j < T; j++) if (src.credits[p][l][j]) found.push({ j: j, l: l, h: null, v: src.credits[p][l][j] });
      }
    });
    found.sort(function (a, b) { return Math.abs(b.v) - Math.abs(a.v); });
    return found.slice(0, N_ROUTES).map(function (r) {
      r.block = src.blocks[r.l] + (r.h === null ? '' : '.h' + r.h);
      return r;
    });
  }
  /* Routes as a flow: source tokens on the left, blocks (or heads) in the
     middle, the answer token on the right; width ∝ |credit|, green gives,
     red takes away. Hover a route for its exact credit. */
  function flow(list, row, label, tell) {
    var W = 340, X = [92, 196, 300];
    var sources = [], blocks = [];
    list.forEach(function (r) {
      if (sources.indexOf(r.j) < 0) sources.push(r.j);
      if (blocks.indexOf(r.block) < 0) blocks.push(r.block);
    });
    sources.sort(function (a, b) { return a - b; });
    var n = Math.max(sources.length, blocks.length, 1), H = 24 + 26 * n;
    var root = sv('svg', { width: W, height: H, viewBox: '0 0 ' + W + ' ' + H });
    root.id = 'routes';
    if (!list.length) { add(root, sv('text', { x: 8, y: 16 }, 'no credit from any source')); return root; }
    var y = function (i, count) { return 14 + (i + 0.5) * (H - 20) / count; };
    var big = Math.abs(list[0].v);
    list.forEach(function (r) {
      var y0 = y(sources.indexOf(r.j), sources.length), y1 = y(blocks.indexOf(r.block), blocks.length), y2 = H / 2;
      var d = 'M' + X[0] + ',' + y0 + ' C' + (X[0] + X[1]) / 2 + ',' + y0 + ' ' + (X[0] + X[1]) / 2 + ',' + y1 + ' ' + X[1] + ',' + y1 +
        ' C' + (X[1] + X[2]) / 2 + ',' + y1 + ' ' + (X[1] + X[2]) / 2 + ',' + y2 + ' ' + X[2] + ',' + y2;
      var path = add(root, sv('path', { d: d, 'class': 'route ' + (r.v >= 0 ? 'up' : 'down'),
        'stroke-width': (1.5 + 12 * Math.abs(r.v) / big).toFixed(2), 'data-credit': r.v }));
      add(path, sv('title', {}, label(r.j) + ' → ' + r.block + ' → answer: ' + fmt(r.v, true, 7)));
      path.addEventListener('mouseover', function () { tell(r.j, r.block, r.v); });
    });
    sources.forEach(function (j, i) {
      add(root, sv('text', { x: X[0] - 4, y: y(i, sources.length) + 3, 'text-anchor': 'end' }, label(j)));
    });
    blocks.forEach(function (b, i) {
      add(root, sv('text', { x: X[1], y: y(i, blocks.length) - 5, 'text-anchor': 'middle', 'class': 'node' }, 'L' + b));
    });
    add(root, sv('text', { x: X[2] + 4, y: H / 2 + 3 }, visible(row.token)));
    return root;
  }

  // ------------------------------------------------------------------ pages
  function pageMap(root, d) {
    header(root, 'IG-Lens map', Object.assign({}, d.about, { method: d.method + ', n_steps = ' + d.n_steps + ', path = ' + d.path }));
    var slot = h('div');
    if (d.sequences.length > 1) {
      var controls = add(root, h('div', 'controls'));
      add(controls, h('span', null, 'sequence '));
      var select = add(controls, h('select'));
      d.sequences.forEach(function (s, i) { add(select, h('option', null, String(i))).value = i; });
      select.addEventListener('change', function () { show(Number(select.value)); });
    }
    add(root, slot);
    function show(i) {
      slot.textContent = '';
      renderMap(slot, d.layers, d.groups, d.sequences[i].rows, d.vocab, d.sources ? d.sources[i] : null, d.trajectory);
    }
    show(0);
  }

  function pageBatch(root, d) {
    header(root, 'IG-Lens prompt set', d.about);
    add(root, h('div', 'about', d.prompts.length + ' prompts, ' + d.n_tokens + ' attributed tokens, ' + d.layers.length + ' layers'));
    var top = add(root, h('div', 'layout'));
    var p1 = add(top, h('div', 'panel'));
    add(p1, h('h3', null, 'Mean credit per layer'));
    add(p1, chart({ labels: d.layers, bars: d.mean_credit, width: 460, signed: true }));
    var sum = add(p1, h('div', 'completeness'));
    sum.id = 'mean-sum';
    sum.textContent = 'Σ over layers = ' + fmt(d.mean_credit_sum, true) + '   mean Δp = ' + fmt(d.mean_dp, true);
    var p2 = add(top, h('div', 'panel'));
    add(p2, h('h3', null, 'Onset layer, count of tokens'));
    add(p2, chart({ labels: d.layers, bars: d.onsets, width: 460 }));
    add(root, h('h2', null, 'Prompts (click one to open its map)'));
    var list = add(root, h('ul', 'prompts'));
    list.id = 'prompts';
    var slot = add(root, h('div'));
    slot.id = 'prompt-map';
    d.prompts.forEach(function (p, i) {
      var li = add(list, h('li'));
      li.setAttribute('data-index', i);
      add(li, h('span', 'id', p.id));
      add(li, tok('span', 'prompt', p.prompt));
      add(li, document.createTextNode(' → '));
      add(li, tok('span', 'answer', p.answer));
      li.addEventListener('click', function () { open(i); });
    });
    function open(i) {
      Array.prototype.forEach.call(list.children, function (e, j) { e.classList.toggle('selected', i === j); });
      slot.textContent = '';
      var p = d.prompts[i];
      add(slot, h('h2', null, 'Prompt ' + p.id));
      var about = add(slot, h('div', 'about'));
      about.textContent = visible(p.prompt) + '\n→ ' + visible(p.answer);
      if (p.rows.length) renderMap(slot, d.layers, d.groups, p.rows, d.vocab, null, d.trajectory);
      else add(slot, h('div', 'hint', 'No attributed tokens (an empty answer).'));
    }
    if (d.prompts.length) open(0);
  }

  function pageComparison(root, d) {
    header(root, 'IG-Lens comparison', d.about);
    add(root, h('div', 'hint', 'Each method on the same answer tokens; colour scaled per method. ' +
      'resid = |Σ_layers score − Δp|, in probability.'));
    var slot = h('div');
    if (d.sequences.length > 1) {
      var controls = add(root, h('div', 'controls'));
      var select = add(controls, h('select'));
      d.sequences.forEach(function (s, i) { add(select, h('option', null, 'sequence ' + i)).value = i; });
      select.addEventListener('change', function () { show(Number(select.value)); });
    }
    add(root, slot);
    function show(si) {
      slot.textContent = '';
      var seq = d.sequences[si];
      var parts = cellLayout(slot);
      var main = parts.main, kvt = parts.kvt;
      var f = {
        method: kv(kvt, 'method', 'method'), token: kv(kvt, 'token', 'token'), layer: kv(kvt, 'layer', 'layer'),
        score: kv(kvt, 'score', 'score'), sum: kv(kvt, 'Σ layers', 'sum'), dp: kv(kvt, 'Δp', 'dp'),
        expected: kv(kvt, 'expected Σ', 'expected'), resid: kv(kvt, '|Σ − Δp|', 'resid')
      };
      var grid = add(main, h('div', 'grid'));
      grid.id = 'map';
      var template = ['minmax(120px, max-content)'];
      seq.methods.forEach(function (m) { template.push('repeat(' + m.layers.length + ', 18px) 64px 10px'); });
      grid.style.gridTemplateColumns = template.join(' ');
      add(grid, h('div'));
      seq.methods.forEach(function (m) {
        var head = add(grid, h('div', 'methodhead', m.name + ' (' + m.unit + ')'));
        head.style.gridColumn = 'span ' + (m.layers.length + 2);
      });
      add(grid, h('div'));
      seq.methods.forEach(function (m) {
        m.layers.forEach(function (name) {
          var c = add(grid, h('div', 'colhead', name));
          c.style.height = '54px';
        });
        add(grid, h('div', 'num', 'resid'));
        add(grid, h('div', 'gap'));
      });
      seq.rows.forEach(function (row, ri) {
        var label = add(grid, h('div', 'rowhead'));
        add(label, h('span', 'pos', row.pos + ' '));
        add(label, tok('span', 'tok', row.token));
        seq.methods.forEach(function (m, mi) {
          var scale = 0;
          m.scores.forEach(function (r) { r.forEach(function (v) { scale = Math.max(scale, Math.abs(v)); }); });
          m.scores[ri].forEach(function (v, j) {
            var cell = add(grid, h('div', 'cell'));
            cell.style.background = diverging(v, scale);
            cell.setAttribute('data-row', ri);
            cell.setAttribute('data-method', mi);
            cell.setAttribute('data-col', j);
          });
          add(grid, h('div', 'num', fmt(m.resid[ri], false, 3)));
          add(grid, h('div', 'gap'));
        });
      });
      main.addEventListener('mouseover', function (ev) {
        var t = ev.target;
        if (!t.classList || !t.classList.contains('cell')) return;
        var ri = Number(t.getAttribute('data-row')), m = seq.methods[Number(t.getAttribute('data-method'))];
        var j = Number(t.getAttribute('data-col'));
        f.method.textContent = m.name + ' (' + m.unit + ')';
        f.token.textContent = seq.rows[ri].token;
        f.layer.textContent = m.layers[j];
        f.score.textContent = fmt(m.scores[ri][j], true);
        f.sum.textContent = fmt(m.sum[ri], true);
        f.dp.textContent = fmt(m.dp[ri], true);
        f.expected.textContent = fmt(m.expected[ri], true);
        f.resid.textContent = fmt(m.resid[ri], false, 3);
      });
      agreementTable(slot, seq, d.reference);
      var notes = add(slot, h('div', 'panel'));
      add(notes, h('h3', null, 'Methods'));
      seq.methods.forEach(function (m) {
        var line = add(notes, h('div', 'about'));
        add(line, h('b', null, m.name + ': '));
        add(line, document.createTextNode(m.note));
      });
    }
    show(0);
  }

  /* Per answer token, each source-token method's Spearman ρ against IG-Lens's
     per-source credits (by |score|, over the sources the token sees). */
  function agreementTable(slot, seq, reference) {
    var names = Object.keys(seq.agreement || {});
    if (!names.length) return;
    var box = add(slot, h('div', 'panel'));
    box.id = 'agreement';
    add(box, h('h3', null, 'Rank agreement with ' + reference + ' (Spearman ρ of |score| over the sources 0..position)'));
    var table = add(box, h('table', 'stats'));
    var tr = add(table, h('tr'));
    add(tr, h('th', null, 'token'));
    names.forEach(function (n) { add(tr, h('th', null, 'ρ ' + n)); });
    seq.rows.forEach(function (row, ri) {
      var line = add(table, h('tr'));
      var cell = add(line, h('td'));
      add(cell, h('span', 'pos', row.pos + ' '));
      add(cell, tok('span', 'tok', row.token));
      names.forEach(function (n) { add(line, h('td', 'v', fmt(seq.agreement[n][ri], true, 3))).setAttribute('data-method', n); });
    });
  }

  function pageValidation(root, d) {
    header(root, 'IG-Lens validation', { mode: d.mode, methods: d.methods.join(', ') });
    statsTables(root, d.summary, 'group: ');
    var state = { view: 'drops' };
    var controls = add(root, h('div', 'controls'));
    radio(controls, 'vview', [['drops', 'ablation drop']].concat(d.methods.map(function (m) { return [m, m]; })), 'drops',
      function (v) { state.view = v; draw(); });
    var parts = cellLayout(root);
    var main = parts.main, side = parts.side, kvt = parts.kvt;
    var f = { prompt: kv(kvt, 'prompt', 'prompt'), token: kv(kvt, 'token', 'token'),
      layer: kv(kvt, 'layer', 'layer'), drop: kv(kvt, 'ablation drop', 'drop') };
    var scoreFields = {};
    d.methods.forEach(function (m) { scoreFields[m] = kv(kvt, m, 'score-' + m); });
    var traj = add(side, h('div', 'panel'));
    traj.id = 'trajectory';
    var trajBody = add(traj, h('div', 'hint', 'Click a prompt for its lens trajectory and drops.'));
    var grid = null;
    function values(p) { return state.view === 'drops' ? p.drops : (p.scores[state.view] || null); }
    function draw() {
      var scale = 0;
      d.prompts.forEach(function (p) { (values(p) || []).forEach(function (v) { scale = Math.max(scale, Math.abs(v || 0)); }); });
      if (grid) main.removeChild(grid);
      grid = add(main, h('div', 'grid'));
      grid.id = 'map';
      grid.style.gridTemplateColumns = '260px repeat(' + d.layers.length + ', 16px)';
      add(grid, h('div'));
      d.layers.forEach(function (name) { add(grid, h('div', 'colhead', name)).style.height = '40px'; });
      d.prompts.forEach(function (p, ri) {
        var label = add(grid, h('div', 'rowhead'));
        label.setAttribute('data-row', ri);
        add(label, tok('span', 'tok', p.token));
        add(label, h('span', 'pos', '  ' + p.prompt));
        var vals = values(p);
        d.layers.forEach(function (name, j) {
          var cell = add(grid, h('div', 'cell'));
          cell.style.background = vals ? diverging(vals[j], scale) : '#eee';
          cell.setAttribute('data-row', ri);
          cell.setAttribute('data-col', j);
        });
      });
    }
    main.addEventListener('mouseover', function (ev) {
      var t = ev.target;
      if (!t.classList || !t.classList.contains('cell')) return;
      var p = d.prompts[Number(t.getAttribute('data-row'))], j = Number(t.getAttribute('data-col'));
      f.prompt.textContent = p.prompt;
      f.token.textContent = visible(p.token);
      f.layer.textContent = d.layers[j];
      f.drop.textContent = fmt(p.drops[j], true);
      d.methods.forEach(function (m) { scoreFields[m].textContent = p.scores[m] ? fmt(p.scores[m][j], true) : '–'; });
    });
    main.addEventListener('click', function (ev) {
      var t = ev.target.closest ? ev.target.closest('[data-row]') : null;
      if (!t) return;
      var p = d.prompts[Number(t.getAttribute('data-row'))];
      trajBody.textContent = '';
      trajBody.className = '';
      add(trajBody, h('div', null, visible(p.prompt) + ' → ' + visible(p.generated)));
      add(trajBody, chart({
        labels: ['h_0'].concat(d.layers), signed: true,
        series: [{ cls: 'lens', values: p.trajectory.slice(0, d.layers.length + 1), name: 'lens level' },
          { cls: 'drops', values: [0].concat(p.drops), name: 'ablation drop' }]
      }));
    });
    draw();
  }

  /* Facts x blocks: the recovery r(L) of restoring each block's output at the
     attributed position (or the IG-Lens share of the credit reached by it),
     the causal onset framed black and the IG-Lens onset framed green. */
  function pageRestoration(root, d) {
    header(root, 'IG-Lens restoration', { corruptions: d.corruptions.join(', '), methods: d.methods.join(', ') });
    add(root, h('div', 'hint', 'Corrupt the subject, then restore one block\'s output at the attributed position: ' +
      'recovery r(L) = (p_restored − p_corrupt) / (p_clean − p_corrupt). Causal onset: the first block with r ≥ ' +
      String(d.settings.recovery_threshold) + '; a method\'s onset: the first block with ' + String(d.settings.onset_frac) +
      ' of its cumulative |score|. Tokens count when the corruption lowers p by ≥ ' + String(d.settings.min_effect) + ' of p_clean.'));
    var state = { corruption: d.corruptions[0], view: 'recovery', row: -1 };
    var controls = add(root, h('div', 'controls'));
    radio(controls, 'corruption', d.corruptions.map(function (c) { return [c, c]; }), state.corruption,
      function (v) { state.corruption = v; draw(); if (state.row >= 0) showFact(state.row); });
    radio(controls, 'rview', [['recovery', 'recovery r(L)'], ['share', 'IG-Lens share of credit']], 'recovery',
      function (v) { state.view = v; draw(); });
    add(controls, legend('div', 1, 'value'));
    add(root, h('div', 'hint', 'Black frame: causal onset; green frame: IG-Lens onset. Hover a cell for its numbers; click a fact for its curves.'));
    var parts = cellLayout(root);
    var main = parts.main, side = parts.side, kvt = parts.kvt;
    var f = { prompt: kv(kvt, 'prompt', 'prompt'), token: kv(kvt, 'token', 'token'), layer: kv(kvt, 'block', 'layer'),
      recovery: kv(kvt, 'recovery r(L)', 'recovery'), share: kv(kvt, 'IG-Lens share', 'share'),
      causal: kv(kvt, 'causal onset', 'causal'), onset: kv(kvt, 'IG-Lens onset', 'onset'),
      clean: kv(kvt, 'p_clean', 'clean'), corrupt: kv(kvt, 'p_corrupt', 'corrupt') };
    var traj = add(side, h('div', 'panel'));
    traj.id = 'trajectory';
    var trajBody = add(traj, h('div', 'hint', 'Click a fact for its recovery and IG-Lens curves.'));
    var grid = null;
    function trace(fact) { return fact.traces[state.corruption] || null; }
    function draw() {
      if (grid) main.removeChild(grid);
      grid = add(main, h('div', 'grid'));
      grid.id = 'map';
      grid.style.gridTemplateColumns = '260px repeat(' + d.layers.length + ', 16px)';
      add(grid, h('div'));
      d.layers.forEach(function (name) { add(grid, h('div', 'colhead', name)).style.height = '40px'; });
      d.facts.forEach(function (fact, ri) {
        var label = add(grid, h('div', 'rowhead' + (ri === state.row ? ' selected' : '')));
        label.setAttribute('data-row', ri);
        add(label, tok('span', 'tok', fact.token));
        add(label, h('span', 'pos', '  ' + fact.prompt));
        var t = trace(fact), vals = state.view === 'share' ? fact.share : (t ? t.recovery : null);
        d.layers.forEach(function (name, j) {
          var cls = 'cell';
          if (t && t.onset === j) cls += ' onset';
          if (fact.onsets.ig_lens === j) cls += ' igonset';
          var cell = add(grid, h('div', cls));
          cell.style.background = vals ? diverging(vals[j], 1) : '#eee';
          cell.setAttribute('data-row', ri);
          cell.setAttribute('data-col', j);
        });
      });
    }
    function showFact(ri) {
      state.row = ri;
      Array.prototype.forEach.call(grid.querySelectorAll('.rowhead'), function (e) {
        e.classList.toggle('selected', Number(e.getAttribute('data-row')) === ri);
      });
      var fact = d.facts[ri], t = trace(fact);
      trajBody.textContent = '';
      trajBody.className = '';
      add(trajBody, h('div', null, fact.prompt + ' → ' + visible(fact.token)));
      var series = [{ cls: 'share', values: fact.share, name: 'IG-Lens share' }];
      var traced = t && t.shares ? Object.keys(t.shares) : [];
      traced.forEach(function (m) { series.push({ cls: 'traced', values: t.shares[m], name: m + ' share' }); });
      if (t) series.unshift({ cls: 'recovery', values: t.recovery, name: 'recovery, ' + state.corruption });
      add(trajBody, chart({ labels: d.layers, series: series }));
      var onset = function (j) { return j === null || j === undefined ? 'none' : d.layers[j]; };
      add(trajBody, h('div', 'hint', t
        ? 'p_clean = ' + fmt(t.clean) + ', p_corrupt = ' + fmt(t.corrupt) + '; causal onset: ' + onset(t.onset) +
          ', IG-Lens onset: ' + onset(fact.onsets.ig_lens) +
          traced.map(function (m) { return ', ' + m + ' onset: ' + onset(t.onsets[m]); }).join('')
        : 'not traced under ' + state.corruption + '; IG-Lens onset: ' + onset(fact.onsets.ig_lens)));
    }
    main.addEventListener('mouseover', function (ev) {
      var t = ev.target;
      if (!t.classList || !t.classList.contains('cell')) return;
      var fact = d.facts[Number(t.getAttribute('data-row'))], j = Number(t.getAttribute('data-col')), tr = trace(fact);
      f.prompt.textContent = fact.prompt;
      f.token.textContent = visible(fact.token);
      f.layer.textContent = d.layers[j];
      f.recovery.textContent = tr ? fmt(tr.recovery[j]) : 'not traced';
      f.share.textContent = fmt(fact.share[j]);
      f.causal.textContent = tr && tr.onset !== null ? d.layers[tr.onset] : '–';
      f.onset.textContent = fact.onsets.ig_lens !== null ? d.layers[fact.onsets.ig_lens] : '–';
      f.clean.textContent = tr ? fmt(tr.clean) : '–';
      f.corrupt.textContent = tr ? fmt(tr.corrupt) : '–';
    });
    main.addEventListener('click', function (ev) {
      var t = ev.target.closest ? ev.target.closest('[data-row]') : null;
      if (t) showFact(Number(t.getAttribute('data-row')));
    });
    draw();
    // The agreement tables, as the text table shows them: groups with tokens only.
    d.corruptions.forEach(function (c) {
      var groups = {};
      Object.keys(d.summary[c]).forEach(function (g) {
        var ig = d.summary[c][g].ig_lens;
        if (ig && ig.mean_abs_diff && ig.mean_abs_diff.n) groups[g] = d.summary[c][g];
      });
      statsTables(root, groups, 'corruption: ' + c + ', group: ');
    });
  }

  var pages = { map: pageMap, batch: pageBatch, comparison: pageComparison, validation: pageValidation,
    restoration: pageRestoration };
  // A page in a script of its own (graph.js) registers itself in window.iglensPages
  // before this script runs, and draws with these helpers.
  var lib = { h: h, add: add, sv: sv, fmt: fmt, header: header, visible: visible, tok: tok,
    diverging: diverging, dark: dark };
  var own = (window.iglensPages || {})[DATA.kind];
  if (own) own(document.getElementById('app'), DATA, lib);
  else pages[DATA.kind](document.getElementById('app'), DATA);
}());
