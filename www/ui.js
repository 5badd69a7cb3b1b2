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

// A token handed over in the address (#token=...) is kept in localStorage
// under KEY and removed from the address bar; otherwise the stored one.
export function takeToken(key) {
  const m = location.hash.match(/(?:^#|&)token=([^&]+)/);
  if (m) {
    localStorage.setItem(key, decodeURIComponent(m[1]));
    history.replaceState(null, '', location.pathname + location.search);
  }
  return localStorage.getItem(key) || '';
}

// fetch with a deadline. Resolves to {status, json, headers} (status 0 and
// error 'timeout' | 'network' when no answer came); never rejects.
export async function api(path, { method = 'GET', body, token, timeoutMs = 5000 } = {}) {
  const ctl = new AbortController();
  const timer = setTimeout(() => ctl.abort(), timeoutMs);
  const headers = {};
  if (body !== undefined) headers['Content-Type'] = 'application/json';
  if (token) headers.Authorization = `Bearer ${token}`;
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
