// `capstan:plugin/http@0.3.0` on Node: sends with `globalThis.fetch` (stub
// it in tests) and answers as the host does: a fetch that fails with
// "denied" is the host's `denied`, any other failure `transport`.
export async function send({ method, url, headers, body }) {
  let response;
  try {
    response = await fetch(url, {
      method,
      headers: Object.fromEntries(headers),
      body: body.length === 0 ? undefined : body,
    });
  } catch (e) {
    const message = String(e?.message ?? e);
    const payload = /denied/i.test(message) ? { tag: 'denied' } : { tag: 'transport', val: message };
    throw Object.assign(new Error(payload.tag), { payload });
  }
  return {
    status: response.status,
    headers: [...response.headers.entries()],
    body: new Uint8Array(await response.arrayBuffer()),
  };
}
