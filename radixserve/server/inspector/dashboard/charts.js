"use strict";
/* Time-series line/area charts on a canvas, for the cache inspector (no chart library).
 * new TimeChart(canvas, {series: [{name, color}], stacked, yMax, format, windowS})
 *   .push(timeMs, [v0, v1, ...])   adds a point (null: no value) and redraws.
 * The chart keeps the last `windowS` seconds of points; history lives only in the page. */
class TimeChart {
  constructor(canvas, opts) {
    this.canvas = canvas;
    this.series = opts.series;
    this.stacked = !!opts.stacked;
    this.yMax = opts.yMax ?? null;
    this.format = opts.format || ((v) => String(Math.round(v)));
    this.windowS = opts.windowS || 300;
    this.minSpanS = opts.minSpanS || 60;  // the x axis spans the history so far, at least this much
    this.minTop = opts.minTop || 1;
    this.points = [];  // [timeMs, values[]]
    window.addEventListener("resize", () => this.draw());
  }

  push(t, values) {
    this.points.push([t, values]);
    const cut = t - this.windowS * 1000;
    while (this.points.length && this.points[0][0] < cut) this.points.shift();
    this.draw();
  }

  _stackedValues(values) {
    if (!this.stacked) return values;
    let acc = 0;
    return values.map((v) => (acc += v ?? 0));
  }

  _niceMax(v) {
    if (v <= 0) return 1;
    const p = Math.pow(10, Math.floor(Math.log10(v)));
    for (const m of [1, 2, 4, 8, 10]) if (m * p >= v) return m * p;  // quarters stay round
    return 10 * p;
  }

  draw() {
    const c = this.canvas, dpr = window.devicePixelRatio || 1;
    const w = c.clientWidth, h = c.clientHeight;
    if (!w || !h) return;
    c.width = Math.round(w * dpr); c.height = Math.round(h * dpr);
    const g = c.getContext("2d");
    g.setTransform(dpr, 0, 0, dpr, 0, 0);
    g.clearRect(0, 0, w, h);
    const L = 52, R = 10, T = 24, B = 20, pw = w - L - R, ph = h - T - B;
    const now = this.points.length ? this.points[this.points.length - 1][0] : Date.now();
    const first = this.points.length ? this.points[0][0] : now;
    const spanS = Math.min(this.windowS, Math.max(this.minSpanS, (now - first) / 1000));
    const t0 = now - spanS * 1000;
    const rows = this.points.map(([t, v]) => [t, this._stackedValues(v)]);
    let top = this.yMax;
    if (top === null) {
      let m = 0;
      for (const [, v] of rows) for (const x of v) if (x !== null && x > m) m = x;
      top = this._niceMax(Math.max(m, this.minTop));
    }
    const X = (t) => L + ((t - t0) / (now - t0 || 1)) * pw;
    const Y = (v) => T + ph - (Math.min(v, top) / top) * ph;
    g.font = "11px system-ui, sans-serif";
    g.strokeStyle = "#e6eaf0"; g.fillStyle = "#6b7684"; g.lineWidth = 1;
    g.textAlign = "right"; g.textBaseline = "middle";
    for (let i = 0; i <= 4; i++) {
      const v = (top * i) / 4, y = Math.round(Y(v)) + 0.5;
      g.beginPath(); g.moveTo(L, y); g.lineTo(L + pw, y); g.stroke();
      g.fillText(this.format(v), L - 6, y);
    }
    g.textAlign = "center"; g.textBaseline = "top";
    const step = [10, 15, 30, 60, 120].find((st) => spanS / st <= 6) || 60;
    for (let s = 0; s <= spanS + 0.001; s += step) {
      const x = X(now - s * 1000);
      const label = s === 0 ? "now" : `−${s % 60 === 0 ? s / 60 + " min" : s + " s"}`;
      g.fillText(label, Math.min(Math.max(x, L + 12), L + pw - 12), T + ph + 5);
    }
    for (let k = this.series.length - 1; k >= 0; k--) this._drawSeries(g, rows, k, X, Y);
    this._legend(g, L);
  }

  _drawSeries(g, rows, k, X, Y) {
    const color = this.series[k].color;
    const pts = rows.filter(([, v]) => v[k] !== null && v[k] !== undefined);
    if (!pts.length) return;
    if (this.stacked) {
      g.beginPath();
      pts.forEach(([t, v], i) => (i ? g.lineTo(X(t), Y(v[k])) : g.moveTo(X(t), Y(v[k]))));
      for (let i = pts.length - 1; i >= 0; i--) g.lineTo(X(pts[i][0]), Y(k ? pts[i][1][k - 1] : 0));
      g.closePath(); g.globalAlpha = 0.35; g.fillStyle = color; g.fill(); g.globalAlpha = 1;
    }
    g.beginPath(); g.strokeStyle = color; g.lineWidth = 2;
    pts.forEach(([t, v], i) => (i ? g.lineTo(X(t), Y(v[k])) : g.moveTo(X(t), Y(v[k]))));
    g.stroke();
    if (pts.length === 1) { g.fillStyle = color; g.beginPath(); g.arc(X(pts[0][0]), Y(pts[0][1][k]), 3, 0, 7); g.fill(); }
  }

  _legend(g, x) {
    const last = this.points.length ? this.points[this.points.length - 1][1] : [];
    g.textAlign = "left"; g.textBaseline = "middle"; g.font = "12px system-ui, sans-serif";
    for (let k = 0; k < this.series.length; k++) {
      const s = this.series[k], v = last[k];
      const label = `${s.name}${v === null || v === undefined ? "" : " " + this.format(v)}`;
      g.fillStyle = s.color; g.fillRect(x, 7, 10, 10);
      g.fillStyle = "#333d4a"; g.fillText(label, x + 14, 12);
      x += g.measureText(label).width + 30;
    }
  }
}
window.TimeChart = TimeChart;
