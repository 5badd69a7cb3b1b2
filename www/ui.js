// ui.js - what both pages share: the JSON API client, tokens, the server clock.

export const $ = (sel, root = document) => root.querySelector(sel);

export function el(tag, attrs = {}, ...kids) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === 'class') e.className = v;
    else if (k.startsWith('on')) e.addEventListener(k.slice(2), v);
    else e.setAttribute(k, v);
  }
  for (const k of kids) e.append(k);
  return e;
}

// A token handed over in the address (#token=...) is taken out of the
// address bar at once. With no token stored it is kept in localStorage under
// KEY. A different stored token is never replaced silently (a link could
// sign this browser in as someone else): the page asks first, and only the
// "Use the new token" button stores it. A fragment that does not decode
// (#token=%E0) is ignored. Returns the token to use now.
export function takeToken(key) {
  let offered = '';
  const m = location.hash.match(/(?:^#|&)token=([^&]*)/);
  if (m) {
    history.replaceState(null, '', location.pathname + location.search);
    try { offered = decodeURIComponent(m[1]).trim(); } catch { offered = ''; }
  }
  const stored = localStorage.getItem(key) || '';
  if (offered && !stored) {
    localStorage.setItem(key, offered);
    return offered;
  }
  if (offered && offered !== stored) askReplace(key, offered);
  return stored;
}

function askReplace(key, offered) {
  const box = el('div', { class: 'token-ask', role: 'alertdialog' },
    el('p', {}, 'The link you opened carries a different sign-in token than the one this '
      + 'browser keeps. Use it instead only if you trust whoever sent you the link.'),
    el('button', { type: 'button', class: 'token-replace', onclick: () => {
      localStorage.setItem(key, offered);
      location.reload();
    } }, 'Use the new token'),
    el('button', { type: 'button', class: 'token-keep', onclick: () => box.remove() }, 'Keep mine'));
  document.body.prepend(box);
}

// A fresh Idempotency-Key: one per operator action, reused by its retries.
export function newIdemKey() {
  const b = new Uint8Array(16);
  crypto.getRandomValues(b);
  return Array.from(b, (x) => x.toString(16).padStart(2, '0')).join('');
}

// fetch with a deadline. Resolves to {status, json, headers} (status 0 and
// error 'timeout' | 'network' when no answer came); never rejects. idemKey:
// sent as Idempotency-Key (admin writes).
export async function api(path, { method = 'GET', body, token, timeoutMs = 5000, idemKey } = {}) {
  const ctl = new AbortController();
  const timer = setTimeout(() => ctl.abort(), timeoutMs);
  const headers = {};
  if (body !== undefined) headers['Content-Type'] = 'application/json';
  if (token) headers.Authorization = `Bearer ${token}`;
  if (idemKey) headers['Idempotency-Key'] = idemKey;
  try {
    const res = await fetch(path, {
      method, headers, cache: 'no-store', signal: ctl.signal,
      body: body === undefined ? undefined : typeof body === 'string' ? body : JSON.stringify(body),
    });
    const text = await res.text();
    let json = null;
    try { json = JSON.parse(text); } catch { /* not JSON: metrics, or a proxy's page */ }
    return { status: res.status, json, text, headers: res.headers };
  } catch (e) {
    return { status: 0, json: null, text: '', error: e.name === 'AbortError' ? 'timeout' : 'network' };
  } finally {
    clearTimeout(timer);
  }
}

// The server's clock: every answer that carries `now` (epoch ms) corrects
// the offset, taking the middle of the round trip as the moment it was read.
let offsetMs = 0;
export function syncClock(serverNow, sentAt, gotAt) {
  if (typeof serverNow === 'number') offsetMs = serverNow - (sentAt + gotAt) / 2;
}
export const serverNow = () => Date.now() + offsetMs;

export function duration(ms) {
  if (ms < 0) ms = 0;
  const s = Math.floor(ms / 1000);
  const d = Math.floor(s / 86400);
  const hh = String(Math.floor((s % 86400) / 3600)).padStart(2, '0');
  const mm = String(Math.floor((s % 3600) / 60)).padStart(2, '0');
  const ss = String(s % 60).padStart(2, '0');
  return (d > 0 ? `${d}d ` : '') + `${hh}:${mm}:${ss}`;
}

// State by the server's clock; VOIDED stays what the server said.
export function stateAt(a, now) {
  if (a.status === 'VOIDED') return 'VOIDED';
  if (now < a.startTime) return 'NOT_STARTED';
  if (now >= a.endTime) return 'ENDED';
  return 'IN_PROGRESS';
}

export const STATE_WORDS = {
  NOT_STARTED: 'Not started',
  IN_PROGRESS: 'On sale',
  ENDED: 'Ended',
  VOIDED: 'Cancelled',
};

// An admin write that is safe to send again: one Idempotency-Key for the
// action, and when no answer came (timeout, network) or the first request
// is still being served (409 IDEMPOTENCY_KEY_IN_USE), the same request with
// the same key again, up to `tries` times. The server answers a repeated
// key with the first answer and changes nothing, so a slow top-up is never
// added twice. onRetry(n) is told before each retry.
export async function adminWrite(path, opts, { tries = 4, onRetry = () => {} } = {}) {
  const idemKey = newIdemKey();
  let res;
  for (let n = 1; ; n++) {
    res = await api(path, { ...opts, idemKey });
    const inUse = res.json && res.json.code === 'IDEMPOTENCY_KEY_IN_USE';
    if ((res.status !== 0 && !inUse) || n >= tries) return res;
    onRetry(n);
    await new Promise((ok) => setTimeout(ok, inUse ? 1000 : 250));
  }
}
