// The scheduler's status page: fetches status.json every second and
// renders it. What it rendered is mirrored in #status's data-* attributes.
"use strict";
(function () {
  const root = document.getElementById("status");
  let chart = null;
  let marks = [];
  let updates = 0;

  function el(tag, text, cls) {
    const e = document.createElement(tag);
    if (text !== undefined) e.textContent = text;
    if (cls) e.className = cls;
    return e;
  }

  function bits(b) {
    if (!b) return "–";
    const units = [["Gbit/s", 1e9], ["Mbit/s", 1e6], ["kbit/s", 1e3]];
    for (const [u, f] of units) if (b >= f) return (b / f).toFixed(1) + " " + u;
    return b.toFixed(0) + " bit/s";
  }

  function ms(s) { return (s * 1000).toFixed(1) + " ms"; }

  function members(s) {
    const body = document.querySelector("#members tbody");
    body.replaceChildren();
    for (const m of s.members) {
      const tr = el("tr");
      tr.dataset.node = m.name;
      tr.dataset.alive = m.alive;
      tr.append(el("td", m.name), el("td", m.role), el("td", m.rank), el("td", m.id), el("td", m.addr), el("td", m.group || ""),
        el("td", m.alive ? "yes" : "no", m.alive ? "" : "dead"),
        el("td", m.role === "scheduler" ? "" : m.seen_ago_seconds.toFixed(1) + " s ago"));
      body.append(tr);
    }
  }

  function capacities(s) {
    const body = document.querySelector("#capacities tbody");
    body.replaceChildren();
    for (const c of s.capacities) {
      const tr = el("tr");
      tr.dataset.node = c.node;
      tr.append(el("td", c.node), el("td", bits(c.send_bits_per_second), "num"), el("td", bits(c.receive_bits_per_second), "num"));
      body.append(tr);
    }
  }

  function decision(s) {
    const box = document.getElementById("shares");
    box.replaceChildren();
    const d = s.decision;
    document.getElementById("version").textContent = d ? "v" + d.version + " from iteration " + d.from_iteration + (d.probe ? " (probe)" : "") : (s.lb ? "(even split over the servers)" : "(LB off: even split over the servers)");
    document.getElementById("reason").textContent = d ? d.reason : "";
    let sum = 0;
    const shares = [];
    for (const sh of d ? d.shares : []) {
      const pct = 100 * sh.share;
      sum += pct;
      shares.push(sh.node + "=" + pct.toFixed(2));
      const bar = el("div", undefined, "bar " + sh.node.split(" ")[0]);
      bar.dataset.node = sh.node;
      bar.dataset.share = pct.toFixed(4);
      const track = el("div", undefined, "track");
      const fill = el("div", undefined, "fill");
      fill.style.width = pct + "%";
      track.append(fill);
      bar.append(el("span", sh.node, "label"), track, el("span", pct.toFixed(1) + " %"));
      box.append(bar);
    }
    root.dataset.version = d ? d.version : "";
    root.dataset.shares = shares.join(",");
    root.dataset.shareSum = sum.toFixed(4);
  }

  // drawMarks draws a dashed vertical line at every decision in view.
  function drawMarks(u) {
    const ctx = u.ctx;
    let drawn = 0;
    ctx.save();
    ctx.setLineDash([6, 4]);
    ctx.lineWidth = 1.5 * devicePixelRatio;
    for (const m of marks) {
      if (m.iteration < u.scales.x.min || m.iteration > u.scales.x.max) continue;
      const x = Math.round(u.valToPos(m.iteration, "x", true));
      ctx.strokeStyle = m.probe ? "#c33" : "#393";
      ctx.beginPath();
      ctx.moveTo(x, u.bbox.top);
      ctx.lineTo(x, u.bbox.top + u.bbox.height);
      ctx.stroke();
      ctx.fillStyle = ctx.strokeStyle;
      ctx.font = (11 * devicePixelRatio) + "px sans-serif";
      ctx.fillText("v" + m.version, x + 3, u.bbox.top + 12 * devicePixelRatio);
      drawn++;
    }
    ctx.restore();
    root.dataset.marks = drawn;
  }

  function iterations(s) {
    const xs = s.iterations.map(p => p.iteration);
    const ys = s.iterations.map(p => p.seconds);
    const bound = xs.map(() => s.bound_seconds > 0 ? s.bound_seconds : null);
    marks = s.decisions;
    const data = [xs, ys, bound];
    if (!chart) {
      chart = new uPlot({
        width: Math.min(1000, window.innerWidth - 60), height: 320,
        scales: { x: { time: false }, y: { range: (u, min, max) => [0, Math.max(max, 1e-3) * 1.1] } },
        series: [
          { label: "iteration" },
          { label: "iteration time (s)", stroke: "#3a7bd5", width: 2, points: { show: true, size: 4 } },
          { label: "LB bound (s)", stroke: "#8a2be2", dash: [4, 4], width: 1.5, points: { show: false } },
        ],
        axes: [{ label: "iteration" }, { label: "seconds" }],
        hooks: { draw: [drawMarks] },
      }, data, document.getElementById("chart"));
    } else {
      chart.setData(data);
    }
    document.getElementById("bound").textContent = s.bound_seconds > 0 ? ms(s.bound_seconds) : "unknown";
    root.dataset.points = xs.length;
    root.dataset.decisions = marks.length;
    root.dataset.lastIteration = xs.length ? xs[xs.length - 1] : "";
  }

  function render(s) {
    document.getElementById("phase").textContent = s.phase;
    document.getElementById("lbstate").textContent = s.lb ? (s.lb_state || "starting") : "off";
    document.getElementById("updated").textContent = new Date(s.time_ms).toLocaleTimeString();
    members(s);
    capacities(s);
    decision(s);
    iterations(s);
    root.dataset.phase = s.phase;
    root.dataset.members = s.members.length;
    root.dataset.updates = ++updates;
    root.dataset.error = "";
  }

  async function poll() {
    try {
      const r = await fetch("status.json", { cache: "no-store" });
      if (!r.ok) throw new Error(r.status + " " + r.statusText);
      render(await r.json());
    } catch (e) {
      // The scheduler is gone (the job ended) or busy: keep what is shown.
      root.dataset.error = String(e);
      document.getElementById("phase").textContent = "unreachable (" + e + "); showing the last status";
    }
  }

  poll();
  setInterval(poll, 1000);
})();
