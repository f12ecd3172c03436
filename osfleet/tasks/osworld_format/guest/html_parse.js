// OSWorld's active_tab_html_parse, evaluated in the page: texts by class, label, XPath or input, and the
// URL checks of its class&url category. Called with the getter's spec; returns a flat object of values.
(spec => {
  const texts = sel => Array.from(document.querySelectorAll(sel)).map(e => (e.textContent || '').trim());
  const direct = sel => { const e = document.querySelector(sel); if (!e) return [];
    return Array.from(e.childNodes).filter(n => n.nodeType === Node.TEXT_NODE).map(n => n.textContent.trim()).filter(Boolean); };
  const onlyChild = sel => Array.from(document.querySelectorAll(sel)).map(e => e.querySelector('h3'))
    .filter(Boolean).map(h => (h.textContent || '').trim());
  const li = sel => Array.from(document.querySelectorAll(sel + ' li.catAllProducts')).map(e => e.querySelector('span'))
    .filter(Boolean).map(s => (s.innerText || '').trim());
  const byXpath = xp => { try { return document.evaluate(xp, document, null, XPathResult.FIRST_ORDERED_NODE_TYPE, null).singleNodeValue; } catch (e) { return null; } };
  const byText = t => { const low = t.toLowerCase(); const all = document.body ? document.body.querySelectorAll('*') : [];
    let best = null; for (const e of all) { if ((e.textContent || '').toLowerCase().includes(low)) best = e; else if (best) break; } return best; };
  const out = {};
  const pick = (list, table) => { for (const [order, key] of Object.entries(table)) { const i = parseInt(order, 10);
    out[key] = list.length > i ? list[i] : ''; } };
  const c = spec.category;
  if (c === 'class') {
    for (const [cls, table] of Object.entries(spec.class_multiObject || {})) pick(texts('.' + cls), table);
    for (const [cls, table] of Object.entries(spec.class_multiObject_child || {})) pick(direct('.' + cls), table);
    for (const [cls, table] of Object.entries(spec.class_multiObject_only_child || {})) pick(onlyChild('.' + cls), table);
    for (const [cls, wanted] of Object.entries(spec.class_multiObject_search_exist || {})) {
      const found = texts('.' + cls);
      for (const w of wanted) if (w !== 'is_other_exist') out[w] = found.includes(w);
      if (wanted.includes('is_other_exist')) out.is_other_exist = found.some(f => !wanted.includes(f));
    }
    for (const [cls, key] of Object.entries(spec.class_singleObject || {})) { const f = texts('.' + cls); out[key] = f.length ? f[0] : ''; }
  } else if (c === 'label') {
    for (const [label, key] of Object.entries(spec.labelObject || {})) { const e = byText(label); out[key] = e ? (e.textContent || '').trim() : ''; }
  } else if (c === 'xpath') {
    for (const [xp, key] of Object.entries(spec.xpathObject || {})) { const e = byXpath(xp); out[key] = e ? (e.textContent || '').trim() : ''; }
  } else if (c === 'input') {
    for (const [xp, key] of Object.entries(spec.inputObject || {})) { const e = byXpath(xp); out[key] = e && e.value ? String(e.value).trim() : ''; }
  } else if (c === 'class&url') {
    const other = (found, wanted) => found.some(f => wanted.every(w => !w.toLowerCase().includes(f.toLowerCase())));
    for (const [cls, wanted] of Object.entries(spec.class_multiObject || {})) {
      const found = texts('.' + cls);
      for (const w of wanted) if (found.some(f => f.toLowerCase() === w.toLowerCase())) out[w.toLowerCase()] = true;
      out.is_other_exist = other(found, wanted);
    }
    for (const [cls, wanted] of Object.entries(spec.class_multiObject_li || {})) {
      const found = li('.' + cls);
      for (const w of wanted) if (found.some(f => f.toLowerCase() === w.toLowerCase())) out[w.toLowerCase()] = true;
      out.is_other_exist = other(found, wanted);
    }
    const url = location.href.toLowerCase();
    for (const k of spec.url_include_expected || []) if (!(k.toLowerCase() in out)) out[k.toLowerCase()] = url.includes(k.toLowerCase());
    for (const [k, v] of Object.entries(spec.url_include_expected_multichoice || {}))
      if (!(v.toLowerCase() in out)) out[v.toLowerCase()] = url.includes(k.toLowerCase());
  }
  return out;
})
