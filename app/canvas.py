"""The head playground's draggable canvas: a ``gr.HTML`` with a template, scoped CSS and pointer handlers.

Mechanism (Gradio 6's ``gr.HTML`` template + ``js_on_load``, no npm build): the component's ``value`` is the
head spec (:meth:`ssog_core.analysis.head_spec.HeadSpec.to_dict` plus ``sel``, the selected atom) and is what Python
receives. The template places one marker per atom (key coordinates), the ★ query, μ arrows, σ ellipses and λ
labels, over a server-rendered field image (``img`` prop) and an optional picture (``bg``), with a colour bar
and the weight of the cell under the pointer. While an atom or the ★ is dragged, JS assigns the head being
dragged to the ``moving`` prop (markers follow at once; unlike ``value`` it is not synced to Gradio on every
move) and asks the ``preview`` server function for a new field image, with at most two requests in flight and
always the latest positions; on release ``value`` takes the new head. On release it fires the custom
``release`` event; Python's answer carries ``ack`` (the release time), so the page can show the round trip.
``pick`` selects an atom, ``addatom`` adds one where the user double-clicks; arrow keys move a focused atom, which
keeps the focus through the redraws that follow (a marker the redraw replaced gets it back).
"""

from __future__ import annotations

import base64
import io
from typing import Any

from PIL import Image

from app.state import AppContext, AppError

CANVAS_SIZE = 440  # px of the canvas' longer side

FIT_MIN_CELLS = 5  # the zoomed window's shortest side: a window of one cell would hide where the atoms are

# Template: a JS template literal (no "{{": Handlebars runs first). It draws V, the head being dragged (``moving``)
# or else the component's value, in a W × H px box at most (narrower screens scale it down: every position is a
# percentage). Coordinates are grid cells; the overlay SVG's viewBox makes a cell centre (y, x) the point (x, y),
# and its window is the view ``Z``: [top, left, rows, cols] in cell edges and the CSS that places the grid-sized
# images under it. That is the whole grid, or with ``fit`` (a zoom) the ★ and every atom's centre with 1.5 cells
# around them, at least FIT_MIN_CELLS a side; it is computed from ``value``, not ``moving``, so it holds still
# while dragging.
# No line comments inside the template (it is evaluated as one expression).
# λ labels are stacked downwards where they would overlap each other or the ★ (clustered atoms, as trained heads
# pile theirs near the query: the ★'s box is placed first). Every prop used here must be passed
# at construction.
HTML_TEMPLATE = """
${((V, Z) => ((W, H) => `
<div class="pgw" style="grid-template-columns:minmax(0, ${W}px) 64px">
 <div class="pg" data-view="${Z.slice(0, 4).join(',')}" style="max-width:${W}px;aspect-ratio:${Z[3]} / ${Z[2]}">
  <img class="bg" src="${bg}" alt="" draggable="false" style="display:${bg ? 'block' : 'none'};${Z[4]}"/>
  <img class="fld" src="${img}" alt="field" draggable="false" style="${Z[4]}"/>
  <svg class="ov" viewBox="${Z[1]} ${Z[0]} ${Z[3]} ${Z[2]}" preserveAspectRatio="none">
   ${V.atoms.map((a, i) => {
     const q = V.query, ppc = size / Math.max(Z[2], Z[3]);
     const dy = a.y - q[0], dx = a.x - q[1], len = Math.hypot(dy, dx);
     const w = wid[i] || [a.sy, a.sx];
     let head = '';
     if (len * ppc > 20) {
       const uy = dy / len, ux = dx / len, r0 = 12 / ppc, hl = 9 / ppc, hw = 4.5 / ppc;
       const ty = a.y - uy * r0, tx = a.x - ux * r0, by = ty - uy * hl, bx = tx - ux * hl;
       const p1 = `${bx - uy * hw},${by + ux * hw}`, p2 = `${bx + uy * hw},${by - ux * hw}`;
       head = `<polygon class="ah" points="${tx},${ty} ${p1} ${p2}"/>`;
     }
     return `<line class="mu" x1="${q[1]}" y1="${q[0]}" x2="${a.x}" y2="${a.y}"/>${head}
             <ellipse class="sg" cx="${a.x}" cy="${a.y}" rx="${w[1]}" ry="${w[0]}"/>`;
   }).join('')}
  </svg>
  ${V.atoms.map((a, i) => `<div class="atom ${i === V.sel ? 'sel' : ''}" data-i="${i}" tabindex="0" role="button"
      aria-label="atom ${i + 1}, looks at row ${a.y.toFixed(1)}, column ${a.x.toFixed(1)},
        λ ${(lam[i] ?? 0).toFixed(2)}: arrow keys move it"
      title="atom ${i + 1}: drag (or focus and use the arrow keys) to move, click to select"
      style="left:${(a.x - Z[1]) / Z[3] * 100}%;top:${(a.y - Z[0]) / Z[2] * 100}%">${i + 1}</div>`).join('')}
  ${((placed) => V.atoms.map((a, i) => {
     const x = (a.x - Z[1]) / Z[3] * W + 14;
     let y = (a.y - Z[0]) / Z[2] * H - 24;
     while (placed.some(p => Math.abs(p[0] - x) < 48 && Math.abs(p[1] - y) < 13)) y += 13;
     placed.push([x, y]);
     return `<div class="lam" style="left:${x / W * 100}%;top:${y / H * 100}%">λ=${(lam[i] ?? 0).toFixed(2)}</div>`;
   }).join(''))([[(V.query[1] - Z[1]) / Z[3] * W - 10, (V.query[0] - Z[0]) / Z[2] * H - 8]])}
  <div class="star" tabindex="0" role="button"
      aria-label="query ★ at row ${V.query[0]}, column ${V.query[1]}: arrow keys move it with its atoms"
      title="the query: drag (or focus and use the arrow keys) to move it (the atoms keep their offsets μ)"
      style="left:${(V.query[1] - Z[1]) / Z[3] * 100}%;top:${(V.query[0] - Z[0]) / Z[2] * 100}%"
      >★</div>
 </div>
 <div class="kyw"><svg class="ky" viewBox="0 ${Z[0]} 1 ${Z[2]}" preserveAspectRatio="none">
  <polyline points="${ky.map((v, i) => `${0.97 * v},${i}`).join(' ')}"/></svg></div>
 <svg class="kx" viewBox="${Z[1]} 0 ${Z[3]} 1" preserveAspectRatio="none">
  <polyline points="${kx.map((v, i) => `${i},${1 - 0.97 * v}`).join(' ')}"/></svg>
 <div class="info"><span class="cbar" title="colour = the ★ query's attention weight on each key cell">
   <span>0</span><i style="background:${cbar}"></i><span class="vmax">${vmax}</span> weight</span>
  <span class="hov"></span><br/><span class="inf">${info}</span><br/>
  <span class="zoom">${Z[2] < V.grid[0] || Z[3] < V.grid[1]
   ? `zoomed: rows ${Math.ceil(Z[0])}–${Math.floor(Z[0] + Z[2])}, columns ${Math.ceil(Z[1])}–`
     + `${Math.floor(Z[1] + Z[3])} of ${V.grid[0]}×${V.grid[1]}` : ''}</span>
  <span class="lat">${lat}</span> <span class="err">${err}</span></div>
</div>
`)(Math.round(size * Z[3] / Math.max(Z[2], Z[3])), Math.round(size * Z[2] / Math.max(Z[2], Z[3])))
)(moving && moving.atoms ? moving : value, ((v) => {
  const [gh, gw] = v.grid;
  let t = -0.5, l = -0.5, h = gh, w = gw;
  if (fit) {
    let y0 = v.query[0], y1 = v.query[0], x0 = v.query[1], x1 = v.query[1];
    v.atoms.forEach(a => {
      y0 = Math.min(y0, a.y); y1 = Math.max(y1, a.y); x0 = Math.min(x0, a.x); x1 = Math.max(x1, a.x);
    });
    const side = (lo, hi, n) => {
      const len = Math.min(n, Math.max(hi - lo + 3, __FIT_MIN__)), mid = (lo + hi) / 2;
      const start = Math.min(Math.max(mid - len / 2, -0.5), n - 0.5 - len);
      return [Math.round(start * 100) / 100, Math.round(len * 100) / 100];
    };
    [t, h] = side(y0, y1, gh); [l, w] = side(x0, x1, gw);
  }
  const css = `left:${(-0.5 - l) / w * 100}%;top:${(-0.5 - t) / h * 100}%;`
    + `width:${gw / w * 100}%;height:${gh / h * 100}%`;
  return [t, l, h, w, css];
})(value))}
""".replace("__FIT_MIN__", str(FIT_MIN_CELLS))

CSS_TEMPLATE = """
.pgw { display: grid; gap: 6px; align-items: start;
       font-family: ui-sans-serif, system-ui, sans-serif; user-select: none; }
.pg { position: relative; width: 100%; touch-action: none; background: #111; border-radius: 4px; overflow: hidden; }
.pg img { position: absolute; image-rendering: pixelated; pointer-events: none; max-width: none; }
.pg img.bg { image-rendering: auto; }
.ov { position: absolute; inset: 0; width: 100%; height: 100%; pointer-events: none; overflow: visible; }
.ov .mu { stroke: #fff; stroke-width: 2; vector-effect: non-scaling-stroke; }
.ov .ah { fill: #fff; }
.ov .sg { fill: none; stroke: #fff; stroke-width: 1.5; stroke-dasharray: 5 4; vector-effect: non-scaling-stroke; }
.atom, .star { position: absolute; transform: translate(-50%, -50%); cursor: grab; touch-action: none;
               display: flex; align-items: center; justify-content: center; }
.atom { width: 22px; height: 22px; border-radius: 50%; background: rgba(255,255,255,0.92); color: #111;
        font: 700 12px/1 ui-sans-serif, system-ui, sans-serif; border: 2px solid #222; }
.atom.sel { border-color: #e5002b; box-shadow: 0 0 0 3px rgba(229,0,43,0.45); }
.atom:focus-visible, .star:focus-visible { outline: 3px solid #3b82f6; outline-offset: 2px; }
.lam { position: absolute; color: #fff; pointer-events: none; white-space: nowrap;
       font: 700 11px/1 ui-sans-serif, system-ui, sans-serif; text-shadow: 0 0 3px #000, 0 0 2px #000; }
.star { width: 30px; height: 30px; font-size: 28px; line-height: 1; color: #fff;
        text-shadow: 0 0 3px #000, 0 0 1px #000; }
.ky, .kx { background: rgba(127,127,127,0.08); border-radius: 3px; }
.kyw { position: relative; align-self: stretch; }  /* as tall as the canvas beside it, at any width */
.ky { position: absolute; inset: 0; width: 100%; height: 100%; }
.kx { width: 100%; height: 56px; grid-column: 1; }
.ky polyline, .kx polyline { fill: none; stroke: #3b82f6; stroke-width: 2; vector-effect: non-scaling-stroke; }
.info { grid-column: 1 / span 2; font-size: 13px; line-height: 1.4; }
.cbar { display: inline-flex; align-items: center; gap: 4px; margin-right: 10px; }
.cbar i { display: inline-block; width: 90px; height: 10px; border-radius: 2px; }
.hov { font-variant-numeric: tabular-nums; color: #374151; }
.lat { color: #6b7280; }
.err { color: #dc2626; font-weight: 600; }
"""

# Event names appear in quotes here, which is how gr.HTML finds custom events ('pick', 'release', 'addatom').
JS_ON_LOAD = """
let drag = null, inflight = 0, pending = false, sent = 0, shown = 0;
const MAX_INFLIGHT = 2;  // two previews overlap: one computes while the other travels or renders
const stats = { frames: 0, moves: 0, ms: [], release: [] };  // read by benchmarks/app_latency.py
window.ssogCanvasStats = stats;
const clone = v => JSON.parse(JSON.stringify(v));
function pos(e) {  // the pointer in grid cells, kept inside the window shown
  const pg = element.querySelector('.pg'), r = pg.getBoundingClientRect();
  const [t, l, h, w] = pg.dataset.view.split(',').map(Number);
  const y = t + (e.clientY - r.top) / r.height * h, x = l + (e.clientX - r.left) / r.width * w;
  const clip = (v, lo, n) => Math.min(Math.max(v, lo), lo + n);
  return [Math.round(clip(y, t, h) * 10) / 10, Math.round(clip(x, l, w) * 10) / 10];
}
// Live preview: ask the server function for the field of the latest positions; never more than MAX_INFLIGHT
// requests at once, the newest positions are always sent next, and a late answer never replaces a newer one.
// An answer is painted straight into the DOM (no template re-render) and kept in `frame`; it becomes props with
// the next pointer move (one re-render for both) or on release, so a later re-render never shows an older frame.
let frame = null;
const kyPoints = ky => ky.map((v, i) => `${0.97 * v},${i}`).join(' ');
const kxPoints = kx => kx.map((v, i) => `${i},${1 - 0.97 * v}`).join(' ');
function paint(r) {
  element.querySelector('img.fld').src = r.img;
  element.querySelector('.vmax').textContent = r.vmax;
  element.querySelector('.ky polyline').setAttribute('points', kyPoints(r.ky));
  element.querySelector('.kx polyline').setAttribute('points', kxPoints(r.kx));
  element.querySelector('.inf').textContent = r.info;
}
function commitFrame() {
  if (!frame) return;
  const r = frame;
  frame = null;
  props.img = r.img; props.ky = r.ky; props.kx = r.kx; props.wid = r.wid; props.lam = r.lam;
  props.info = r.info; props.vmax = r.vmax; props.cbar = r.cbar; props.err = '';
}
function pump() {
  if (props.live !== 'server') return;
  if (inflight >= MAX_INFLIGHT) { pending = true; return; }
  inflight += 1;
  const id = ++sent, t = performance.now();
  server.preview({ value: props.moving || props.value, overlay: !!props.bg }).then(r => {
    if (id < shown || !r) return;
    shown = id;
    if (r.error) { props.err = r.error; return; }
    frame = r;
    paint(r);
    stats.frames += 1; stats.ms.push(performance.now() - t);
  }).catch(err => { props.err = 'preview failed: ' + err; }).finally(() => {
    inflight -= 1;
    if (pending) { pending = false; pump(); }
  });
}
element.addEventListener('pointerdown', e => {
  const a = e.target.closest('.atom'), s = e.target.closest('.star');
  if (!a && !s) return;
  e.preventDefault();
  try { (a || s).setPointerCapture(e.pointerId); } catch (_) { /* synthetic events have no capturable pointer */ }
  if (a) {
    drag = { kind: 'atom', i: +a.dataset.i };
    if (props.value.sel !== drag.i) {
      const v = clone(props.value); v.sel = drag.i; props.value = v;
      trigger('pick', { i: drag.i });
    }
  } else {
    drag = { kind: 'star', start: pos(e), v0: clone(props.value) };
  }
});
// Hover: the weight of the key cell under the pointer (from the last head Python evaluated).
element.addEventListener('pointermove', e => {
  if (drag || !e.target.closest('.pg') || !props.dens) return;
  const [y, x] = pos(e), i = Math.round(y), j = Math.round(x), row = props.dens[i];
  if (!row || row[j] === undefined) return;
  element.querySelector('.hov').textContent = `key (${i}, ${j}): weight ${row[j]}`;
});
element.addEventListener('pointermove', e => {
  if (!drag) return;
  stats.moves += 1;
  const [y, x] = pos(e);
  let v;
  if (drag.kind === 'atom') {
    v = clone(props.moving || props.value); v.atoms[drag.i].y = y; v.atoms[drag.i].x = x;
  } else {
    v = clone(drag.v0);
    const [gh, gw] = v.grid, q0 = drag.v0.query;
    const qy = Math.min(Math.max(q0[0] + Math.round(y - drag.start[0]), 0), gh - 1);
    const qx = Math.min(Math.max(q0[1] + Math.round(x - drag.start[1]), 0), gw - 1);
    v.query = [qy, qx];
    v.atoms.forEach(a => { a.y += qy - q0[0]; a.x += qx - q0[1]; });
  }
  props.moving = v;  // redraws the markers; the value (synced to Gradio on every set) is written once, on release
  commitFrame();  // in the same re-render
  pump();
});
const end = () => {
  if (!drag) return;
  drag = null;
  commitFrame();
  if (props.moving) { props.value = props.moving; props.moving = null; }
  trigger('release', { t: performance.now() });
};
element.addEventListener('pointerup', end);
element.addEventListener('pointercancel', end);
// Keyboard: a focused atom (or the ★, which takes its atoms along) moves one cell per arrow key, a tenth with Shift;
// the new head goes to Python as a drag release does.
const STEPS = { ArrowUp: [-1, 0], ArrowDown: [1, 0], ArrowLeft: [0, -1], ArrowRight: [0, 1] };
element.addEventListener('keydown', e => {
  const a = e.target.closest('.atom'), s = e.target.closest('.star'), step = STEPS[e.key];
  if ((!a && !s) || !step || drag) return;
  e.preventDefault();
  const v = clone(props.value), [gh, gw] = v.grid, k = e.shiftKey ? 0.1 : 1;
  const clip = (t, n) => Math.round(Math.min(Math.max(t, -0.5), n - 0.5) * 10) / 10;
  if (a) {
    const i = +a.dataset.i;
    v.atoms[i].y = clip(v.atoms[i].y + step[0] * k, gh); v.atoms[i].x = clip(v.atoms[i].x + step[1] * k, gw);
    if (v.sel !== i) { v.sel = i; trigger('pick', { i }); }
  } else {
    const qy = Math.min(Math.max(v.query[0] + step[0], 0), gh - 1);
    const qx = Math.min(Math.max(v.query[1] + step[1], 0), gw - 1);
    v.atoms.forEach(t => { t.y += qy - v.query[0]; t.x += qx - v.query[1]; });
    v.query = [qy, qx];
  }
  props.value = v;
  trigger('release', { t: performance.now() });
});
// Keyboard focus survives a redraw. Gradio patches the template's nodes in place, but one whose place in the
// template changed is replaced, and a full re-render replaces them all: the marker that had the focus (an atom by
// its number, or the ★) gets it back, so a keyboard user's next arrow press still moves it. Focus that left on
// purpose (to another element, or a click elsewhere) is not taken back.
let keep = null;  // the selector of the marker that has the keyboard focus
element.addEventListener('focusin', e => {
  const a = e.target.closest('.atom'), s = e.target.closest('.star');
  keep = a ? `.atom[data-i="${a.dataset.i}"]` : s ? '.star' : null;
});
element.addEventListener('focusout', e => {
  const left = e.target;  // still in the page once events settle: it was left, not replaced by a redraw
  setTimeout(() => { if (left.isConnected && !element.contains(document.activeElement)) keep = null; });
});
new MutationObserver(() => {
  const now = document.activeElement;
  if (!keep || (now && now !== document.body && now.isConnected)) return;
  const again = element.querySelector(keep);
  if (again) again.focus({ preventScroll: true });
}).observe(element, { childList: true, subtree: true });
element.addEventListener('dblclick', e => {
  if (e.target.closest('.atom, .star') || !e.target.closest('.pg')) return;
  const [y, x] = pos(e);
  trigger('addatom', { y, x });
});
watch('ack', () => {
  if (!props.ack) return;
  const ms = performance.now() - props.ack;
  stats.release.push(ms);
  props.lat = `release → update ${ms.toFixed(0)} ms`;
});
"""


def canvas_props(size: int = CANVAS_SIZE) -> dict:
    """Initial values of every prop the template reads (a missing one breaks the template)."""
    return dict(
        img="",
        bg="",
        size=size,
        wid=[],
        lam=[],
        ky=[],
        kx=[],
        info="",
        dens=[],
        vmax="",
        cbar="",
        lat="",
        err="",
        ack=0,
        live="server",
        moving=None,
        fit=False,
    )


def underlay_url(ctx: AppContext, sha: str | None, value: dict[str, Any]) -> str:
    """The picture under the canvas, resized to the grid's aspect as the model's input is (stretched, never
    cropped: on a model's patch grid every cell is then one patch), sent once as a JPEG data URL."""
    if not sha:
        raise AppError("pick or upload an image first (top of the page) to draw the head over it")
    img = ctx.image(sha).image
    gh, gw = value["grid"]
    w = CANVAS_SIZE * gw // max(gh, gw)
    h = CANVAS_SIZE * gh // max(gh, gw)
    fitted = img.convert("RGB").resize((w, h), Image.Resampling.BICUBIC)
    buf = io.BytesIO()
    fitted.save(buf, format="JPEG", quality=85)
    return "data:image/jpeg;base64," + base64.b64encode(buf.getvalue()).decode("ascii")
