// Two small canvas charts (a rolling line chart and grouped bars). Hand-written because the page has no build
// step and fetches nothing from the internet; they only need axes, a legend and automatic scaling.

function prepare(canvas) {
  const ratio = window.devicePixelRatio || 1;
  const width = canvas.clientWidth || 300;
  const height = canvas.clientHeight || 170;
  if (canvas.width !== Math.round(width * ratio)) canvas.width = Math.round(width * ratio);
  if (canvas.height !== Math.round(height * ratio)) canvas.height = Math.round(height * ratio);
  const g = canvas.getContext("2d");
  g.setTransform(ratio, 0, 0, ratio, 0, 0);
  g.clearRect(0, 0, width, height);
  return { g, width, height };
}

function niceMax(value) {
  if (!(value > 0)) return 1;
  const power = 10 ** Math.floor(Math.log10(value));
  for (const step of [1, 2, 2.5, 5, 10]) if (value <= step * power) return step * power;
  return 10 * power;
}

const PAD = { left: 58, right: 8, top: 8, bottom: 20 };

function axes(g, width, height, max, unit, labelled = true) {
  g.font = "11px system-ui, sans-serif";
  g.strokeStyle = "#334155";
  g.fillStyle = "#94a3b8";
  g.lineWidth = 1;
  for (let i = 0; i <= 4; i += 1) {
    const y = PAD.top + ((height - PAD.top - PAD.bottom) * i) / 4;
    g.beginPath(); g.moveTo(PAD.left, y); g.lineTo(width - PAD.right, y); g.stroke();
    const value = max * (1 - i / 4);
    if (labelled) g.fillText(`${value >= 100 ? Math.round(value) : +value.toFixed(1)}${unit}`, 2, y + 4);
  }
}

function legend(element, series, latest = [], unit = "") {
  // Each series' latest value next to its name: the number a person looks for first.
  if (!element) return;
  element.replaceChildren(...series.map((s, index) => {
    const item = document.createElement("span");
    const swatch = document.createElement("i");
    swatch.style.background = s.colour;
    const value = latest[index];
    const shown = Number.isFinite(value) ? ` ${value >= 10 ? Math.round(value) : +value.toFixed(1)}${unit}` : "";
    const number = document.createElement("b");
    number.textContent = shown;
    item.append(swatch, s.name, number);
    return item;
  }));
}

// What both charts share: the canvas, the legend (each series' latest value beside its name), the scale with its
// axes, and the text shown before there is data. A subclass keeps its own data and plots it.
class Chart {
  /** @param {{name: string, colour: string}[]} series */
  constructor(canvas, legendElement, series, unit) {
    this.canvas = canvas;
    this.legendElement = legendElement;
    this.series = series;
    this.unit = unit;
    legend(legendElement, series);
  }

  /** After a push: the newest values go into the legend, and the chart is drawn again. */
  showLatest(values) {
    legend(this.legendElement, this.series, values, this.unit);
    this.draw();
  }

  /** Clears the canvas and draws axes scaled to the finite ones of `values`; returns what plotting needs. */
  scaled(values) {
    const { g, width, height } = prepare(this.canvas);
    const finite = values.filter((v) => Number.isFinite(v));
    const max = niceMax(Math.max(0, ...finite));
    axes(g, width, height, max, this.unit, finite.length > 0);
    const plotW = width - PAD.left - PAD.right;
    const plotH = height - PAD.top - PAD.bottom;
    return { g, width, height, max, plotW, plotH, finite: finite.length > 0 };
  }

  empty(g, width, height) {
    g.fillStyle = "#64748b";
    g.font = "13px system-ui, sans-serif";
    g.fillText("waiting for data…", width / 2 - 50, height / 2);
  }
}

export class LineChart extends Chart {
  constructor(canvas, legendElement, series, { points = 60, unit = "" } = {}) {
    super(canvas, legendElement, series, unit);
    this.points = points;
    this.values = series.map(() => []);
    this.draw();
  }

  push(values) {
    values.forEach((value, index) => {
      const list = this.values[index];
      list.push(value);
      if (list.length > this.points) list.shift();
    });
    this.showLatest(values);
  }

  draw() {
    const { g, width, height, max, plotW, plotH, finite } = this.scaled(this.values.flat());
    if (!finite) { this.empty(g, width, height); return; }
    // Drawn last to first, so the first series stays visible where lines coincide.
    [...this.values.keys()].reverse().forEach((index) => {
      const list = this.values[index];
      g.strokeStyle = this.series[index].colour;
      g.fillStyle = this.series[index].colour;
      g.lineWidth = 2;
      g.beginPath();
      let started = false;
      list.forEach((value, i) => {
        if (!Number.isFinite(value)) { started = false; return; }
        const x = PAD.left + (plotW * (i + this.points - list.length)) / (this.points - 1);
        const y = PAD.top + plotH * (1 - value / max);
        if (started) g.lineTo(x, y); else g.moveTo(x, y);
        started = true;
      });
      g.stroke();
      const last = list[list.length - 1];
      if (Number.isFinite(last)) { // a dot on the newest point (a lone point draws no line)
        g.beginPath();
        g.arc(width - PAD.right, PAD.top + plotH * (1 - last / max), 3, 0, 2 * Math.PI);
        g.fill();
      }
    });
  }
}

export class BarChart extends Chart {
  constructor(canvas, legendElement, series, { groups = 8, unit = "" } = {}) {
    super(canvas, legendElement, series, unit);
    this.groups = groups;
    this.rows = []; // [{label, values}]
    this.draw();
  }

  push(label, values) {
    this.rows.push({ label, values });
    if (this.rows.length > this.groups) this.rows.shift();
    this.showLatest(values);
  }

  draw() {
    const { g, width, height, max, plotW, plotH } = this.scaled(this.rows.flatMap((r) => r.values));
    if (!this.rows.length) { this.empty(g, width, height); return; }
    const groupW = plotW / this.groups;
    const barW = Math.max(2, (groupW - 8) / this.series.length);
    this.rows.forEach((row, group) => {
      const x0 = PAD.left + group * groupW + 4;
      row.values.forEach((value, index) => {
        if (!Number.isFinite(value)) return;
        const h = plotH * (value / max);
        g.fillStyle = this.series[index].colour;
        g.fillRect(x0 + index * barW, PAD.top + plotH - h, barW - 1, h);
      });
      g.fillStyle = "#94a3b8";
      g.font = "11px system-ui, sans-serif";
      g.fillText(row.label, x0, height - 5);
    });
  }
}
