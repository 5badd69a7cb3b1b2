// buyer.js - the buyer page: every preheated sale from `status`, a countdown
// by the server's clock, one seize button per sale (off for a sale limited to
// groups the token does not name), and the buyer's own coupons from `mine`.
import { $, api, takeToken, syncClock, serverNow, duration, stateAt, STATE_WORDS } from './ui.js';

const STATUS = '/market/consumer/coupon/status';
const SEIZE = '/market/consumer/coupon/seize';
const MINE = '/market/consumer/coupon/mine';
const TOKEN_KEY = 'couponseize.buyerToken';

// The outcome in words, by `code`. final: the button stays off afterwards.
const OUTCOMES = {
  SEIZED: { text: 'You got it! The coupon is yours.', cls: 'good', final: true },
  ALREADY_SEIZED: { text: 'You already have this coupon (one per person).', cls: 'good', final: true },
  SOLD_OUT: { text: 'Sold out: every coupon is gone.', cls: 'bad', final: true },
  ENDED: { text: 'This sale has ended.', cls: 'bad', final: true },
  VOIDED: { text: 'This sale was cancelled.', cls: 'bad', final: true },
  NO_SUCH_ACTIVITY: { text: 'This sale does not exist (any more).', cls: 'bad', final: true },
  NOT_STARTED: { text: 'Not started yet: try again when the countdown ends.', cls: 'wait' },
  TOO_MANY_REQUESTS: { text: 'Very busy right now: try again in a moment.', cls: 'wait' },
  UNAVAILABLE: { text: 'The service is busy; nothing was taken. Try again.', cls: 'wait' },
  UNKNOWN_OUTCOME: { text: 'No clear answer; checking whether the coupon is yours...', cls: 'wait' },
  UNAUTHORIZED: { text: 'Sign in first: paste your token above.', cls: 'bad' },
  FORBIDDEN: { text: 'Not allowed.', cls: 'bad' },
  NOT_ELIGIBLE: { text: 'This sale is for other user groups.', cls: 'bad', final: true },
  BAD_REQUEST: { text: 'The request was refused as malformed.', cls: 'bad' },
};
const NO_ANSWER = { text: 'No answer from the server: try again.', cls: 'wait' };

let token = takeToken(TOKEN_KEY);
const cards = new Map(); // idStr -> {a, node, busy, done}

// The token's "groups" claim, read without checking it (the server decides;
// this only keeps the button off for a sale the buyer cannot join).
function tokenGroups() {
  try {
    const p = token.split('.')[1].replace(/-/g, '+').replace(/_/g, '/');
    const claims = JSON.parse(atob(p + '='.repeat((4 - (p.length % 4)) % 4)));
    return Array.isArray(claims.groups) ? claims.groups.filter((g) => typeof g === 'string') : [];
  } catch {
    return [];
  }
}

// Whether this buyer may seize sale a: anyone, unless it names groups.
function eligible(a) {
  const want = Array.isArray(a.eligibleGroups) ? a.eligibleGroups : [];
  if (want.length === 0) return true;
  const have = tokenGroups();
  return want.some((g) => have.includes(g));
}

function showWho() {
  $('#who').textContent = token ? 'token set' : 'no token: seizing needs one';
}

function setOutcome(c, o, extra = '') {
  const out = $('.outcome', c.node);
  out.textContent = o.text + extra;
  out.className = `outcome ${o.cls}`;
}

function render(c) {
  const { a, node } = c;
  const now = serverNow();
  const st = stateAt(a, now);
  const stateEl = $('.state', node);
  stateEl.textContent = STATE_WORDS[st] || st;
  stateEl.className = `state ${st}`;
  node.dataset.state = st;
  let cd = '';
  if (st === 'NOT_STARTED') cd = `Starts in ${duration(a.startTime - now)}`;
  else if (st === 'IN_PROGRESS') cd = `Ends in ${duration(a.endTime - now)}`;
  else cd = st === 'VOIDED' ? 'Cancelled' : 'Ended';
  $('.countdown', node).textContent = cd;
  const left = typeof a.remaining === 'number' ? a.remaining : null;
  $('.remaining', node).textContent =
    left === null ? `${a.totalNum} coupons` : `${left} of ${a.totalNum} left`;
  const pct = left === null || !a.totalNum ? 100 : Math.max(0, Math.min(100, (100 * left) / a.totalNum));
  $('.bar > span', node).style.width = `${pct}%`;
  const groups = Array.isArray(a.eligibleGroups) ? a.eligibleGroups : [];
  const may = eligible(a);
  const whoEl = $('.who-may', node);
  whoEl.textContent = groups.length === 0 ? 'Open to everyone'
    : `Only for: ${groups.join(', ')}${may ? '' : ' (not you)'}`;
  whoEl.classList.toggle('bad', !may);
  // Off while a request is in flight, after a final answer, outside the
  // window, and for a buyer outside the sale's groups.
  $('.seize', node).disabled = c.busy || c.done || st !== 'IN_PROGRESS' || !may;
}

async function seize(c) {
  if (c.busy || c.done) return; // a second click sends nothing
  c.busy = true;
  render(c);
  setOutcome(c, { text: 'Sending...', cls: 'wait' });
  // idStr, written as a bare number: ids go past what a JS number holds.
  const res = await api(SEIZE, { method: 'POST', body: `{"id":${c.a.idStr}}`, token, timeoutMs: 8000 });
  let o = res.json && OUTCOMES[res.json.code];
  if (!o) o = NO_ANSWER;
  let extra = '';
  if (res.json && res.json.code === 'SEIZED' && typeof res.json.remaining === 'number') {
    c.a.remaining = res.json.remaining;
  }
  if (res.json && res.json.code === 'TOO_MANY_REQUESTS') {
    const ra = res.headers.get('Retry-After');
    if (ra) extra = ` (${ra} s)`;
  }
  if (res.json && res.json.code === 'UNKNOWN_OUTCOME') {
    setOutcome(c, o);
    const st = await api(`${STATUS}?id=${c.a.idStr}`, { token });
    if (st.json && st.json.mine && st.json.mine.seized) o = OUTCOMES.SEIZED;
    else o = { text: 'Not confirmed: the coupon is not yours yet. Try again.', cls: 'wait' };
  }
  c.done = !!o.final;
  c.busy = false;
  setOutcome(c, o, extra);
  render(c);
}

function card(a) {
  const node = $('#card').content.firstElementChild.cloneNode(true);
  node.dataset.id = a.idStr;
  $('.name', node).textContent = a.name;
  const coupon = [a.couponName, a.couponAmount && a.couponAmount !== '0.00' ? `${a.couponAmount} off` : '']
    .filter(Boolean).join(' - ');
  $('.coupon', node).textContent = coupon;
  const c = { a, node, busy: false, done: false };
  $('.seize', node).addEventListener('click', () => seize(c));
  return c;
}

// mine.seized for each sale, once: a buyer who already has it sees so.
async function checkMine(c) {
  if (!token) return;
  const res = await api(`${STATUS}?id=${c.a.idStr}`, { token });
  if (res.json && res.json.mine && res.json.mine.seized && !c.done) {
    c.done = true;
    setOutcome(c, OUTCOMES.ALREADY_SEIZED);
    render(c);
  }
}

async function load() {
  const sent = Date.now();
  const res = await api(`${STATUS}?size=200`);
  const got = Date.now();
  if (!res.json || res.json.code !== 'OK') {
    $('#info').textContent = 'The sales could not be loaded; retrying...';
    return;
  }
  syncClock(res.json.now, sent, got);
  const acts = res.json.activities || [];
  $('#info').textContent = acts.length ? (res.json.stale ? 'Showing saved data: the server is catching up.' : '')
    : 'No sales right now.';
  const list = $('#list');
  const seen = new Set();
  for (const a of acts) {
    seen.add(a.idStr);
    let c = cards.get(a.idStr);
    if (!c) {
      c = card(a);
      cards.set(a.idStr, c);
      list.append(c.node);
      checkMine(c);
    } else {
      c.a = a;
    }
    render(c);
  }
  for (const [id, c] of cards) {
    if (!seen.has(id)) { c.node.remove(); cards.delete(id); }
  }
}

const MINE_WORDS = { UNUSED: 'Unused', USED: 'Used', EXPIRED: 'Expired', VOIDED: 'Cancelled' };

// "My coupons": the first 100, newest first, with their state.
async function loadMine() {
  const table = $('#mine');
  if (!token) {
    table.hidden = true;
    $('#mine-info').textContent = 'Paste your token to see your coupons.';
    return;
  }
  const res = await api(`${MINE}?size=100`, { token });
  if (!res.json || res.json.code !== 'OK') {
    $('#mine-info').textContent = res.json && res.json.code === 'UNAUTHORIZED'
      ? 'Your token was refused.' : 'Your coupons could not be loaded; retrying...';
    return;
  }
  const rows = res.json.coupons || [];
  $('#mine-info').textContent = rows.length ? `${res.json.total} coupon(s)`
    : 'No coupons yet (a new one shows here within a few seconds).';
  const body = $('tbody', table);
  body.replaceChildren(...rows.map((c) => {
    const tr = document.createElement('tr');
    tr.dataset.id = c.idStr;
    tr.dataset.state = c.status;
    const amount = c.couponAmount && c.couponAmount !== '0.00' ? `${c.couponAmount} off` : '';
    const over = c.couponThreshold && c.couponThreshold !== '0.00' ? ` over ${c.couponThreshold}` : '';
    for (const text of [c.activityName, amount + over, MINE_WORDS[c.status] || c.status,
      new Date(c.validUntil).toLocaleString(), c.orderId || '']) {
      const td = document.createElement('td');
      td.textContent = text;
      tr.append(td);
    }
    return tr;
  }));
  table.hidden = rows.length === 0;
}

$('#token-form').addEventListener('submit', (ev) => {
  ev.preventDefault();
  const v = $('#token').value.trim();
  if (v) { token = v; localStorage.setItem(TOKEN_KEY, v); $('#token').value = ''; }
  showWho();
  for (const c of cards.values()) { checkMine(c); render(c); }
  loadMine();
});

showWho();
load();
loadMine();
setInterval(load, 2000);
setInterval(loadMine, 5000);
setInterval(() => { for (const c of cards.values()) render(c); }, 250);
