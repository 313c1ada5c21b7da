// FNV-1a (32 bit) of a string's UTF-16 code units, as 8 hex digits: a short, stable revision of
// the rendered flags (not a security hash).
export function fnv1a(text) {
  let h = 0x811c9dc5;
  for (let i = 0; i < text.length; i += 1) {
    h ^= text.charCodeAt(i);
    h = Math.imul(h, 0x01000193) >>> 0;
  }
  return h.toString(16).padStart(8, '0');
}
