// operator.js - the operator page: create / top-up / preheat / revoke over the
// admin API, and every second the live stock, seize rate, breaker, sync queue,
// and the reserves nodes hold (with a return for a node whose lease is over).
import { $, api, adminWrite, takeToken, syncClock, serverNow, duration, stateAt, STATE_WORDS } from './ui.js';

const ACTIVITY = '/market/admin/coupon/activity';
const RESERVES = '/market/admin/coupon/reserves';
const TOKEN_KEY = 'couponseize.adminToken';

let token = takeToken(TOKEN_KEY);
const rows = new Map(); // idStr -> {a, node}
let prevCounts = null; // {t, counts: {code: n}} of the last metrics read

function say(text, good) {
  const m = $('#msg');
  m.textContent = text;
  m.className = `msg ${good ? 'good' : 'bad'}`;
}

function answerText(res) {
  if (!res.json) return res.error ? `no answer (${res.error})` : `HTTP ${res.status}`;
  return `${res.json.code}: ${res.json.msg}`;
}

// RFC 3339 with this browser's offset, from a datetime-local value.
function rfc3339(local) {
  const d = new Date(local);
  if (Number.isNaN(d.getTime())) return '';
  const off = -d.getTimezoneOffset();
  const p = (n) => String(Math.floor(Math.abs(n))).padStart(2, '0');
  const sign = off >= 0 ? '+' : '-';
  return `${d.getFullYear()}-${p(d.getMonth() + 1)}-${p(d.getDate())}T${p(d.getHours())}:` +
    `${p(d.getMinutes())}:${p(d.getSeconds())}${sign}${p(off / 60)}:${p(off % 60)}`;
}

function localInput(ms) {
  const d = new Date(ms);
  const p = (n) => String(n).padStart(2, '0');
  return `${d.getFullYear()}-${p(d.getMonth() + 1)}-${p(d.getDate())}T${p(d.getHours())}:` +
    `${p(d.getMinutes())}:${p(d.getSeconds())}`;
}

function render(r) {
  const { a, node } = r;
  const now = serverNow();
  const st = stateAt(a, now);
  const s = $('.state', node);
  s.textContent = STATE_WORDS[st] || st;
  s.className = `state ${st}`;
  node.dataset.state = st;
  $('.ident', node).textContent = `#${a.idStr}`;
  let w = '';
  if (st === 'NOT_STARTED') w = `starts in ${duration(a.startTime - now)}`;
  else if (st === 'IN_PROGRESS') w = `ends in ${duration(a.endTime - now)}`;
  else w = `ended ${new Date(a.endTime).toLocaleString()}`;
  $('.window', node).textContent = w;
  const live = typeof a.remaining === 'number';
  $('.remaining', node).textContent = live ? `${a.remaining} / ${a.totalNum}` : `- / ${a.totalNum}`;
  $('.remaining', node).dataset.value = live ? String(a.remaining) : '';
  $('.stock', node).textContent =
    `live in Redis${live ? '' : ' (not preheated)'}; MySQL stock ${a.stockNum}`;
  const k = a.coupons;
  const groups = Array.isArray(a.eligibleGroups) && a.eligibleGroups.length
    ? `; only for ${a.eligibleGroups.join(', ')}` : '';
  $('.coupons', node).textContent = k
    ? `coupons: ${k.unused} unused, ${k.used} used, ${k.expired} expired (${k.returned} returned), ${k.voided} voided${a.returnOnExpiry ? '; expired ones return to stock' : ''}${groups}`
    : 'coupons: unknown (MySQL unavailable)';
  const pct = live && a.totalNum ? Math.max(0, Math.min(100, (100 * a.remaining) / a.totalNum)) : 0;
  $('.bar > span', node).style.width = `${pct}%`;
  const open = st === 'NOT_STARTED' || st === 'IN_PROGRESS';
  $('.topup', node).disabled = !open;
  $('.revoke', node).disabled = st === 'VOIDED';
}

async function topup(r) {
  const k = Number($('.topup-k', r.node).value);
  if (!Number.isInteger(k) || k < 1) { say('Add stock: give a whole number of coupons, 1 or more.', false); return; }
  const btn = $('.topup', r.node);
  btn.disabled = true;
  const res = await adminWrite(ACTIVITY, { method: 'PUT', body: `{"id":${r.a.idStr},"addStock":${k}}`, token },
    { onRetry: () => say(`No answer yet to "add ${k}"; asking again (it is never added twice).`, true) });
  btn.disabled = false;
  if (res.json && res.json.code === 'OK') {
    say(`Added ${k} coupons to "${r.a.name}" (Redis: ${res.json.redisStock}).`, true);
    refresh();
  } else {
    say(`Add stock failed: ${answerText(res)}`, false);
  }
}

// Two steps instead of a dialog: the first click arms btn for 4 s (showing
// ask) and answers false; a second click within them answers true.
function confirmed(btn, ask, label) {
  if (!btn.dataset.armed) {
    btn.dataset.armed = '1';
    btn.textContent = ask;
    setTimeout(() => { delete btn.dataset.armed; btn.textContent = label; }, 4000);
    return false;
  }
  delete btn.dataset.armed;
  btn.textContent = label;
  return true;
}

async function revoke(r) {
  const btn = $('.revoke', r.node);
  if (!confirmed(btn, 'Really revoke?', 'Revoke')) return;
  btn.disabled = true;
  const res = await adminWrite('/market/admin/coupon/revoke', { method: 'POST', body: `{"id":${r.a.idStr}}`, token, timeoutMs: 30000 });
  if (res.json && res.json.code === 'OK') say(`Revoked "${r.a.name}".`, true);
  else say(`Revoke failed: ${answerText(res)}`, false);
  refresh();
}

// The reserves of one sale, one row per node incarnation, updated in place
// (a "Return" button armed by a first click survives the refresh).
function renderReserves(r, list) {
  const box = $('.reserves', r.node);
  const body = $('tbody', box);
  box.hidden = list.length === 0;
  const seen = new Set();
  for (const x of list) {
    const key = `${x.incarnation}:${x.epoch}`;
    seen.add(key);
    let tr = body.querySelector(`tr[data-key="${key}"]`);
    if (!tr) {
      tr = $('#reserve-row').content.firstElementChild.cloneNode(true);
      tr.dataset.key = key;
      tr.dataset.incarnation = x.incarnation;
      $('.return', tr).addEventListener('click', () => giveBack(r, tr));
      body.append(tr);
    }
    $('.inc', tr).textContent = x.incarnation.slice(0, 8);
    $('.inc', tr).title = `${x.incarnation}, epoch ${x.epoch}`;
    $('.left', tr).textContent = `${x.left === null ? '?' : x.left} / ${x.amount}`;
    const age = x.leaseAgeMs === null ? 'never' : `${(x.leaseAgeMs / 1000).toFixed(1)} s ago`;
    $('.lease', tr).textContent = x.leaseExpired ? `${age}, expired` : age;
    tr.dataset.expired = String(x.leaseExpired);
    const btn = $('.return', tr);
    if (!btn.dataset.busy) btn.disabled = !x.leaseExpired;
  }
  for (const tr of [...body.children]) if (!seen.has(tr.dataset.key)) tr.remove();
}

async function giveBack(r, tr) {
  const btn = $('.return', tr);
  const inc = tr.dataset.incarnation;
  if (!confirmed(btn, 'Sure?', 'Return')) return;
  btn.disabled = true;
  btn.dataset.busy = '1';
  const res = await adminWrite('/market/admin/coupon/reserve/return',
    { method: 'POST', body: `{"id":${r.a.idStr},"incarnation":"${inc}"}`, token, timeoutMs: 15000 });
  delete btn.dataset.busy;
  if (res.json && res.json.code === 'OK') {
    // What the node may have granted stays out of stock until it replays
    // (DESIGN.md rule 16); the page says so rather than promising stock.
    const parked = res.json.parked ? `; ${res.json.parked} kept out of stock until that node replays its journal` : '';
    say(`Returned node ${inc.slice(0, 8)}'s reserve of "${r.a.name}": ${res.json.returned ?? 'unknown'} coupons back in stock${parked}.`, true);
  } else {
    say(`Return failed: ${answerText(res)}`, false);
  }
  refresh();
}

function row(a) {
  const node = $('#row').content.firstElementChild.cloneNode(true);
  node.dataset.id = a.idStr;
  const r = { a, node };
  $('.name', node).textContent = a.name;
  $('.topup', node).addEventListener('click', () => topup(r));
  $('.revoke', node).addEventListener('click', () => revoke(r));
  return r;
}

// couponseize_requests_total{route="seize",code="X"} N, by code.
function seizeCounts(text) {
  const counts = {};
  const re = /^couponseize_requests_total\{route="seize",code="([A-Z_]+)"\} (\d+)/gm;
  let m;
  while ((m = re.exec(text)) !== null) counts[m[1]] = Number(m[2]);
  return counts;
}

function gauge(text, name) {
  const m = text.match(new RegExp(`^${name} (\\d+)`, 'm'));
  return m ? Number(m[1]) : null;
}

async function refreshMetrics() {
  const res = await api('/market/admin/metrics', { token });
  if (res.status !== 200) { $('#node .rates').textContent = `metrics: ${answerText(res)}`; return; }
  const b = gauge(res.text, 'couponseize_breaker_state');
  if (b !== null) $('#node .breaker').textContent = ['closed', 'open', 'half-open'][b] || String(b);
  const t = Date.now();
  const counts = seizeCounts(res.text);
  if (prevCounts) {
    const dt = (t - prevCounts.t) / 1000;
    const parts = [];
    for (const code of Object.keys(counts).sort()) {
      const rate = (counts[code] - (prevCounts.counts[code] || 0)) / dt;
      parts.push(`${code} ${rate.toFixed(rate < 10 ? 1 : 0)}`);
    }
    $('#node .rates').textContent = parts.length ? parts.join(' · ') : 'no seizes yet';
    $('#node .rates').dataset.total = String(Object.values(counts).reduce((x, y) => x + y, 0));
  }
  prevCounts = { t, counts };
}

async function refresh() {
  if (!token) { $('#who').textContent = 'no token: paste an admin token'; return; }
  const sent = Date.now();
  const [res, rsv] = await Promise.all([api(`${ACTIVITY}?page=1&size=50`, { token }),
    api(RESERVES, { token })]);
  const got = Date.now();
  if (!res.json || res.json.code !== 'OK') {
    $('#who').textContent = answerText(res);
    return;
  }
  $('#who').textContent = 'admin token set';
  syncClock(res.json.now, sent, got);
  const j = res.json;
  if (j.breaker) $('#node .breaker').textContent = j.breaker;
  $('#node .queue').textContent = j.queueDepth === null || j.queueDepth === undefined ? 'unknown' : String(j.queueDepth);
  $('#node .updated').textContent = new Date(serverNow()).toLocaleTimeString();
  // Open reserves by sale (null: the list could not be read this time).
  const bySale = new Map();
  const rsvOk = rsv.json && rsv.json.code === 'OK';
  if (rsvOk) {
    for (const x of rsv.json.reserves || []) {
      if (!bySale.has(x.activityIdStr)) bySale.set(x.activityIdStr, []);
      bySale.get(x.activityIdStr).push(x);
    }
  }
  const list = $('#rows');
  const seen = new Set();
  let prev = null;
  for (const a of j.activities || []) {
    seen.add(a.idStr);
    let r = rows.get(a.idStr);
    if (!r) { r = row(a); rows.set(a.idStr, r); }
    r.a = a;
    // Newest first, as the API pages them.
    if (prev ? prev.nextSibling !== r.node : list.firstChild !== r.node) {
      if (prev) prev.after(r.node); else list.prepend(r.node);
    }
    prev = r.node;
    render(r);
    if (rsvOk) renderReserves(r, bySale.get(a.idStr) || []);
  }
  for (const [id, r] of rows) if (!seen.has(id)) { r.node.remove(); rows.delete(id); }
}

$('#create').addEventListener('submit', async (ev) => {
  ev.preventDefault();
  const v = (n) => ev.target.elements.namedItem(n).value.trim();
  const body = {
    name: v('name'),
    totalNum: Number(v('totalNum')),
    distributeStartTime: rfc3339(v('start')),
    distributeEndTime: rfc3339(v('end')),
  };
  if (v('validityDays')) body.validityDays = Number(v('validityDays'));
  if (v('couponName')) body.couponName = v('couponName');
  if (v('couponAmount')) body.couponAmount = v('couponAmount');
  const groups = v('eligibleGroups').split(',').map((g) => g.trim()).filter(Boolean);
  if (groups.length) body.eligibleGroups = groups;
  if ($('#create [name="returnOnExpiry"]').checked) body.returnOnExpiry = true;
  const res = await adminWrite(ACTIVITY, { method: 'POST', body, token, timeoutMs: 30000 });
  if (res.status === 201 && res.json) {
    say(`Created "${body.name}" as #${res.json.idStr}.`, true);
    refresh();
  } else {
    say(`Create failed: ${answerText(res)}`, false);
  }
});

$('#preheat').addEventListener('click', async () => {
  const res = await adminWrite('/market/admin/coupon/preheat', { method: 'POST', token, timeoutMs: 30000 });
  if (res.json && res.json.code === 'OK') say(`Preheated: ${res.json.loaded} sales loaded, ${res.json.created} new stock fields.`, true);
  else say(`Preheat failed: ${answerText(res)}`, false);
  refresh();
});

$('#token-form').addEventListener('submit', (ev) => {
  ev.preventDefault();
  const v = $('#token').value.trim();
  if (v) { token = v; localStorage.setItem(TOKEN_KEY, v); $('#token').value = ''; }
  refresh();
});

// Defaults for the form: starts in 5 minutes, lasts an hour.
const form = $('#create').elements;
form.namedItem('start').value = localInput(Date.now() + 5 * 60000);
form.namedItem('end').value = localInput(Date.now() + 65 * 60000);

refresh();
refreshMetrics();
setInterval(() => { refresh(); refreshMetrics(); }, 1000);
setInterval(() => { for (const r of rows.values()) render(r); }, 250);
