/* heedful serve: the page. Plain JavaScript, no dependencies; talks only to the JSON API.
 *
 * Safety: everything the user typed or the server echoed is put into the DOM with textContent
 * or attributes. The one exception is the `html` fields of API answers: they are the library's
 * renderers' output (heedful.render), which escapes every string it writes, and are inserted as
 * they are so that the page shows exactly what a notebook shows.
 */
'use strict';

(function () {
  const $ = (id) => document.getElementById(id);
  const SVG = 'http://www.w3.org/2000/svg';
  const DEFAULT_METHODS = ['normxlogit', 'grad_x_input', 'saliency'];
  /** Ticked when no method is: the library's default first (NormXLogit: one forward pass), else
   * the cheapest gradient methods. */
  const COLORS = ['#b3452f', '#0969da', '#1a7f37', '#8250df', '#bf8700', '#1b7c83', '#cf222e', '#6e7781'];

  const state = {
    models: [],
    methods: [],          // /api/methods for the current model
    selected: [],         // method names in the order they were picked
    last: null,           // last explain answer (what is shown)
    lastRequest: null,
    lastGeneration: null,
    lastConversation: null,
    lastRun: null,
    busy: false,
    view: 'explain',
    lastTrace: null,
    restoring: null,      // hash state waiting for models / methods to load
    writtenHash: '',
  };

  // ------------------------------------------------------------------ small helpers
  function el(tag, props, children) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(props || {})) {
      if (value === undefined || value === null || value === false) continue;
      if (key === 'text') node.textContent = String(value);
      else if (key === 'class') node.className = value;
      else if (key === 'hidden') node.hidden = true;
      else node.setAttribute(key, value === true ? '' : String(value));
    }
    for (const child of children || []) node.append(child);
    return node;
  }

  function svg(tag, attrs, text) {
    const node = document.createElementNS(SVG, tag);
    for (const [key, value] of Object.entries(attrs || {})) node.setAttribute(key, String(value));
    if (text !== undefined) node.textContent = String(text);
    return node;
  }

  function fmt(value, digits) {
    if (value === null || value === undefined || Number.isNaN(value)) return '–';
    return Number(value).toFixed(digits === undefined ? 3 : digits);
  }

  /** Insert a renderer fragment from the API (already escaped by heedful.render) and run its own
   * scripts (the generation view's hover script); JSON data blocks stay as they are. */
  function insertFragment(container, html) {
    container.innerHTML = html;
    container.querySelectorAll('script').forEach((old) => {
      if (old.type && old.type !== 'text/javascript') return;
      const fresh = document.createElement('script');
      fresh.textContent = old.textContent;
      old.replaceWith(fresh);
    });
  }

  class ApiError extends Error {
    constructor(message, hint, status, estimate) {
      super(message);
      this.hint = hint || '';
      this.status = status || 0;
      this.estimate = estimate || null;  // a long request the server wants confirmed (409)
    }
  }

  async function api(path, init) {
    let response;
    try {
      response = await fetch(path, init);
    } catch (err) {
      throw new ApiError('cannot reach the server', 'is `heedful serve` still running?');
    }
    let data = null;
    try { data = await response.json(); } catch (err) { data = null; }
    if (!response.ok) {
      throw new ApiError((data && data.error) || `HTTP ${response.status}`, data && data.hint, response.status, data && data.estimate);
    }
    return data;
  }

  function post(path, body) {
    return api(path, { method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify(body) });
  }

  /** Run a request as a job: POST /api/jobs, then follow its server-sent events (progress, then
   * result or error). Falls back to the synchronous route when the server has no job API. */
  async function runJob(kind, request, route) {
    let job;
    try {
      job = await post('/api/jobs', { kind, request });
    } catch (err) {
      if (err.status === 404 || err.status === 405) return post(route, request);
      throw err;
    }
    return new Promise((resolve, reject) => {
      const source = new EventSource(`/api/jobs/${encodeURIComponent(job.id)}/events`);
      let finished = false;
      const finish = (fn, value) => { finished = true; source.close(); fn(value); };
      source.addEventListener('progress', (ev) => showProgress(JSON.parse(ev.data)));
      source.addEventListener('result', (ev) => finish(resolve, JSON.parse(ev.data)));
      source.addEventListener('error', (ev) => {
        if (finished) return;
        if (ev.data) {
          const data = JSON.parse(ev.data);
          finish(reject, new ApiError(data.error, data.hint, data.estimate ? 409 : 0, data.estimate));
        } else {
          finish(reject, new ApiError('lost the connection to the server', 'is `heedful serve` still running?'));
        }
      });
    });
  }

  // ------------------------------------------------------------------ status and errors
  /** The status box of the shown view (each view has one). */
  function statusBox() {
    const view = document.querySelector('.view:not([hidden])');
    return (view && view.querySelector('.status')) || $('status');
  }

  function showProgress(p) {
    const box = statusBox();
    box.hidden = false;
    const stage = p.stage || 'working';
    const total = Number(p.total) || 0;
    box.querySelector('span').textContent = total ? `${stage} · ${p.done} / ${total}` : stage;
    const bar = box.querySelector('progress');
    if (total) { bar.max = total; bar.value = Math.min(Number(p.done) || 0, total); } else { bar.removeAttribute('value'); }
  }

  function setBusy(busy, text) {
    state.busy = busy;
    $('explain').disabled = busy;
    $('generate').disabled = busy;
    $('conversation').disabled = busy;
    $('trace').disabled = busy;
    $('steer').disabled = busy;
    if (busy) {
      showProgress({ stage: text || 'sending', done: 0, total: 0 });
      $('error').hidden = true;
    } else {
      document.querySelectorAll('.status').forEach((box) => { box.hidden = true; });
    }
  }

  function showError(box, err) {
    box.replaceChildren(el('div', { text: err.message || String(err) }));
    if (err.hint) box.append(el('div', { class: 'hint', text: `Hint: ${err.hint}` }));
    box.hidden = false;
  }

  // ------------------------------------------------------------------ models
  function currentModel() {
    return state.models.find((m) => m.name === $('model').value) || null;
  }

  function isLanguageModel(model) {
    return !!model && (model.decoder || model.task === 'causal_lm' || model.task === 'masked_lm');
  }

  async function loadModels() {
    state.models = await api('/api/models');
    const select = $('model');
    select.replaceChildren();
    for (const m of state.models) {
      const status = m.loaded ? 'loaded' : (m.built ? 'built' : 'not built');
      select.append(el('option', { value: m.name, text: `${m.name} — ${m.task} (${status})` }));
    }
    const wanted = state.restoring && state.restoring.get('model');
    const preset = state.models.find((m) => m.name === wanted) || state.models.find((m) => m.default) || state.models[0];
    if (preset) select.value = preset.name;
    const lm = state.models.find((m) => m.task === 'causal_lm') || preset;
    document.querySelectorAll('.model-select').forEach((other) => {
      other.replaceChildren(...[...select.options].map((o) => o.cloneNode(true)));
      if (lm) other.value = lm.name;
    });
    await modelChanged();
  }

  /** Hide and forget the shown results: they belong to the model they were computed with. */
  function clearResults() {
    state.last = null;
    state.lastRequest = null;
    state.lastGeneration = null;
    $('results').hidden = true;
    $('heatmaps').replaceChildren();
    $('generation').hidden = true;
    $('generation-html').replaceChildren();
    $('conversation-result').hidden = true;
    $('turns').replaceChildren();
    state.lastConversation = null;
    $('error').hidden = true;
  }

  async function modelChanged() {
    const model = currentModel();
    if (!model) return;
    clearResults();
    $('model-status').textContent = model.built
      ? `${model.task}${model.labels ? ' · labels: ' + model.labels.join(', ') : ''}`
      : 'not built yet: the first request builds it (progress shown below).';
    updateTargets(model);
    $('generate-box').hidden = !model.decoder;
    $('conversation-box').hidden = model.task !== 'causal_lm';
    await loadMethods(model.name);
    writeHash();
  }

  // ------------------------------------------------------------------ targets
  function fillSelect(select, values) {
    select.replaceChildren(...values.map((v) => el('option', { value: v, text: v })));
  }

  function updateTargets(model) {
    const lm = isLanguageModel(model);
    const labels = model.labels || [];
    const kind = $('target-kind');
    for (const option of kind.options) {
      if (option.value === 'label') option.hidden = option.disabled = lm || !labels.length;
      if (option.value === 'contrast') option.hidden = option.disabled = !lm && labels.length < 2;
      if (option.value === 'token') option.hidden = option.disabled = !lm;
    }
    if (kind.selectedOptions[0] && kind.selectedOptions[0].disabled) kind.value = 'predicted';
    fillSelect($('target-label'), labels);
    fillSelect($('contrast-a'), labels);
    fillSelect($('contrast-b'), labels);
    if (labels.length > 1) $('contrast-b').value = labels[1];
    for (const id of ['contrast-a', 'contrast-b']) {
      $(id).hidden = lm;
      $(`${id}-text`).hidden = !lm;
    }
    targetKindChanged();
  }

  function targetKindChanged() {
    const kind = $('target-kind').value;
    $('target-label-box').hidden = kind !== 'label';
    $('target-contrast-box').hidden = kind !== 'contrast';
    $('target-token-box').hidden = kind !== 'token';
  }

  function targetString() {
    const kind = $('target-kind').value;
    const lm = isLanguageModel(currentModel());
    if (kind === 'label') return $('target-label').value || null;
    if (kind === 'contrast') {
      const a = lm ? $('contrast-a-text').value : $('contrast-a').value;
      const b = lm ? $('contrast-b-text').value : $('contrast-b').value;
      return a && b ? `${a} vs ${b}` : null;
    }
    if (kind === 'token') return $('target-token').value || null;
    return null;
  }

  // ------------------------------------------------------------------ methods and their options
  async function loadMethods(modelName) {
    const box = $('methods');
    box.replaceChildren(el('p', { class: 'note', text: 'loading methods…' }));
    state.methods = await api(`/api/methods?model=${encodeURIComponent(modelName)}`);
    const restoring = state.restoring;
    if (restoring && restoring.get('methods') !== null) {
      state.selected = (restoring.get('methods') || '').split(',').filter(Boolean);
    }
    const known = new Set(state.methods.filter((m) => m.supported !== false).map((m) => m.name));
    state.selected = state.selected.filter((name) => known.has(name));
    const chosen = restoring && restoring.get('methods') !== null;  // an address's own pick, even none
    if (!state.selected.length && !chosen) {
      const fallback = DEFAULT_METHODS.find((name) => known.has(name)) || [...known][0];
      if (fallback) state.selected = [fallback];
    }
    box.replaceChildren(...state.methods.map((m) => methodRow(m, restoring)));
    state.restoring = null;
    filterMethods();
    methodsChanged();
  }

  function optionInput(method, option, restoring) {
    const id = `opt-${method.name}-${option.name}`;
    const saved = restoring ? restoring.get(`o.${method.name}.${option.name}`) : null;
    const value = saved !== null && saved !== undefined ? JSON.parse(saved) : option.default;
    let input;
    if (option.choices && option.choices.length) {
      input = el('select', { id });
      for (const choice of option.choices) {
        input.append(el('option', { value: JSON.stringify(choice), text: choice === null ? 'none' : String(choice) }));
      }
      input.value = JSON.stringify(value);
    } else if (option.type === 'bool') {
      input = el('input', { id, type: 'checkbox' });
      input.checked = !!value;
    } else if (option.type === 'int' || option.type === 'float') {
      input = el('input', {
        id, type: 'number', step: option.type === 'int' ? '1' : 'any',
        min: option.min ?? undefined, max: option.max ?? undefined,
        placeholder: option.default === null ? 'default' : undefined,
      });
      input.value = value === null ? '' : String(value);
    } else {
      input = el('input', { id, type: 'text', placeholder: option.default === null ? 'default' : undefined });
      input.value = value === null ? '' : String(value);
    }
    input.dataset.method = method.name;
    input.dataset.option = option.name;
    input.dataset.type = option.choices && option.choices.length ? 'choice' : option.type;
    input.dataset.default = JSON.stringify(option.default);
    input.dataset.nullable = String(!!option.nullable || option.default === null);
    const range = [option.min !== null && option.min !== undefined ? `≥ ${option.min}` : '',
      option.max !== null && option.max !== undefined ? `≤ ${option.max}` : ''].filter(Boolean).join(', ');
    const label = el('label', { for: id, text: option.name, title: range ? `${option.type} ${range}` : option.type });
    return [label, input];
  }

  function faithfulness(point) {
    // the method's measured AOPC (benchmarks/frontier.py), its cost and interval on hover
    if (!point) return [];
    return [el('span', {
      class: 'faith' + (point.front ? ' front' : ''),
      text: `AOPC ${point.aopc.toFixed(2)}${point.front ? ' ★' : ''}`,
      title: `${point.text} (${point.measured_on})${point.front ? '; ★ on the faithfulness-cost front' : ''}`,
    })];
  }

  function methodRow(method, restoring) {
    const id = `method-${method.name}`;
    const supported = method.supported !== false;
    const box = el('input', { type: 'checkbox', id, value: method.name, disabled: !supported });
    box.checked = state.selected.includes(method.name);
    const row = el('div', { class: 'method' + (supported ? '' : ' unsupported'), 'data-name': method.name }, [
      el('div', { class: 'method-row' }, [box, el('label', { for: id, text: method.name }), el('span', { class: 'family', text: method.family }),
        ...faithfulness(method.faithfulness)]),
      el('div', {
        class: 'what',
        text: supported ? (method.summary || method.cost) : 'not available for this model',
        title: `cost: ${method.cost}`,
      }),
    ]);
    const options = el('div', { class: 'options', hidden: true });
    for (const option of method.options || []) options.append(...optionInput(method, option, restoring));
    if ((method.options || []).length) row.append(options);
    const sync = () => {
      row.classList.toggle('checked', box.checked);
      options.hidden = !box.checked;
    };
    box.addEventListener('change', () => {
      state.selected = state.selected.filter((n) => n !== method.name);
      if (box.checked) state.selected.push(method.name);
      sync();
      methodsChanged();
    });
    sync();
    return row;
  }

  function filterMethods() {
    const needle = $('method-filter').value.trim().toLowerCase();
    for (const row of $('methods').children) {
      if (!row.dataset.name) continue;
      const match = !needle || row.textContent.toLowerCase().includes(needle);
      row.hidden = !(match || state.selected.includes(row.dataset.name));
    }
  }

  function methodsChanged() {
    const n = state.selected.length;
    $('method-count').textContent = n ? `(${n} selected)` : '(pick one or more)';
    writeHash();
  }

  function readOption(input) {
    const type = input.dataset.type;
    if (type === 'choice') return JSON.parse(input.value);
    if (type === 'bool') return input.checked;
    if (input.value === '') return input.dataset.nullable === 'true' ? null : JSON.parse(input.dataset.default);
    if (type === 'int') return Number.parseInt(input.value, 10);
    if (type === 'float') return Number.parseFloat(input.value);
    return input.value;
  }

  /** Options that differ from their defaults, per selected method. */
  function chosenOptions() {
    const options = {};
    for (const name of state.selected) {
      for (const input of document.querySelectorAll(`#methods [data-method="${CSS.escape(name)}"]`)) {
        const value = readOption(input);
        if (JSON.stringify(value) === input.dataset.default) continue;
        (options[name] = options[name] || {})[input.dataset.option] = value;
      }
    }
    return options;
  }

  // ------------------------------------------------------------------ the request and the URL
  function formRequest() {
    return {
      model: $('model').value,
      text: $('text').value,
      methods: state.selected.slice(),
      options: chosenOptions(),
      target: targetString(),
      curve: $('curve').checked,
    };
  }

  function writeHash() {
    if (state.restoring) return;
    const r = formRequest();
    const p = new URLSearchParams();
    p.set('view', state.view);
    if (r.model) p.set('model', r.model);
    if (r.text) p.set('text', r.text);
    p.set('methods', r.methods.join(','));
    for (const [method, opts] of Object.entries(r.options)) {
      for (const [key, value] of Object.entries(opts)) p.set(`o.${method}.${key}`, JSON.stringify(value));
    }
    const kind = $('target-kind').value;
    if (kind !== 'predicted') {
      p.set('tk', kind);
      if (kind === 'label') p.set('t', $('target-label').value);
      if (kind === 'token') p.set('t', $('target-token').value);
      if (kind === 'contrast') {
        const lm = isLanguageModel(currentModel());
        p.set('a', lm ? $('contrast-a-text').value : $('contrast-a').value);
        p.set('b', lm ? $('contrast-b-text').value : $('contrast-b').value);
      }
    }
    if (!r.curve) p.set('curve', '0');
    if (state.lastRun) p.set('run', state.lastRun.id);
    const hash = '#' + p.toString();
    state.writtenHash = hash;
    if (location.hash !== hash) history.replaceState(null, '', hash);
  }

  function applyTarget(p) {
    const kind = p.get('tk') || 'predicted';
    const option = [...$('target-kind').options].find((o) => o.value === kind && !o.disabled);
    $('target-kind').value = option ? kind : 'predicted';
    if (kind === 'label' && p.get('t') !== null) $('target-label').value = p.get('t');
    if (kind === 'token' && p.get('t') !== null) $('target-token').value = p.get('t');
    if (kind === 'contrast') {
      const lm = isLanguageModel(currentModel());
      $(lm ? 'contrast-a-text' : 'contrast-a').value = p.get('a') || '';
      $(lm ? 'contrast-b-text' : 'contrast-b').value = p.get('b') || '';
    }
    targetKindChanged();
  }

  async function applyHash() {
    const p = new URLSearchParams(location.hash.slice(1));
    state.restoring = p;
    $('text').value = p.get('text') || $('text').value;
    $('curve').checked = p.get('curve') !== '0';
    countText();
    if (state.models.length) {
      const model = state.models.find((m) => m.name === p.get('model'));
      if (model) $('model').value = model.name;
      updateTargets(currentModel());
      $('generate-box').hidden = !currentModel() || !currentModel().decoder;
      await loadMethods($('model').value);
    } else {
      await loadModels();
    }
    applyTarget(p);
    showView(VIEWS.includes(p.get('view')) ? p.get('view') : 'explain');
    if (p.get('run')) openRun(p.get('run'));
    writeHash();
  }

  // ------------------------------------------------------------------ explain
  /** runJob, asking first when the server estimates the request to take long (409 with its
   * estimate): confirmed, it is sent again with confirm: true. */
  async function askedJob(kind, request, route) {
    try {
      return await runJob(kind, request, route);
    } catch (err) {
      if (!err.estimate || !window.confirm(`This will take ${err.estimate.text}. Run it?`)) throw err;
      return runJob(kind, { ...request, confirm: true }, route);
    }
  }

  async function explain(event) {
    event.preventDefault();
    if (state.busy) return;
    const request = formRequest();
    if (!request.text.trim()) return showError($('error'), new ApiError('the text is empty', 'type a sentence to explain'));
    if (!request.methods.length) return showError($('error'), new ApiError('no method picked', 'tick one or more methods'));
    writeHash();
    setBusy(true, 'queued');
    try {
      const answer = await askedJob(request.methods.length > 1 ? 'compare' : 'explain', request,
        request.methods.length > 1 ? '/api/compare' : '/api/explain');
      state.last = answer;
      state.lastRequest = request;
      renderResults(answer);
    } catch (err) {
      showError($('error'), err);
    } finally {
      setBusy(false);
    }
  }

  function methodColor(index) {
    return COLORS[index % COLORS.length];
  }

  function renderResults(answer) {
    const target = answer.target || {};
    const prediction = answer.prediction || {};
    const summary = $('summary');
    summary.replaceChildren(
      'Model ', el('b', { text: answer.model }),
      ' · explaining ', el('b', { text: target.label ?? 'the prediction' }),
    );
    if (prediction.label !== undefined && prediction.label !== null) {
      summary.append(' · predicted ', el('b', { text: prediction.label }),
        prediction.probability !== undefined && prediction.probability !== null ? ` (p = ${fmt(prediction.probability, 2)})` : '');
    } else if (prediction.value !== undefined && prediction.value !== null) {
      summary.append(' · value ', el('b', { text: fmt(prediction.value, 3) }));
    }
    if (answer.truncated) summary.append(' · the text was truncated to the model\'s length');
    summary.append(` · ${answer.tokens.length} tokens, ${answer.words.length} words`);

    const grid = $('heatmaps');
    grid.replaceChildren();
    const perMethod = answer.methods.every((m) => typeof m.html === 'string');
    // Without per-method fields, the answer's `html` is every method's fragment in order: split it
    // into its top-level `hf-expl` blocks (the renderer's elements, moved as they are).
    let blocks = null;
    if (!perMethod && typeof answer.html === 'string') {
      const holder = document.createElement('template');
      holder.innerHTML = answer.html;
      const found = [...holder.content.children].filter((n) => n.classList.contains('hf-expl'));
      if (found.length === answer.methods.length) blocks = found;
    }
    answer.methods.forEach((m, i) => {
      const cost = m.cost || {};
      const card = el('article', { class: 'heatmap', 'data-method': m.name, 'aria-label': `${m.name} heatmap` }, [
        el('h3', {}, [
          el('span', {}, [el('span', { class: 'swatch', style: `background:${methodColor(i)}` }), m.name]),
          el('span', { class: 'cost', text: `${fmt(m.seconds, 3)} s · ${cost.forward ?? '?'} fwd · ${cost.backward ?? '?'} bwd` }),
        ]),
      ]);
      if (perMethod) {
        const tokens = el('div', { class: 'hm-tokens' });
        insertFragment(tokens, m.html);
        card.append(el('div', { class: 'units units-tokens', text: 'tokens' }), tokens);
        if (typeof m.html_words === 'string') {
          const words = el('div', { class: 'hm-words' });
          insertFragment(words, m.html_words);
          card.append(el('div', { class: 'units units-words', text: 'words' }), words);
        }
      } else if (blocks) {
        const tokens = el('div', { class: 'hm-tokens' });
        tokens.append(blocks[i]);
        card.append(tokens);
      }
      grid.append(card);
    });
    $('units-box').hidden = !answer.methods.some((m) => typeof m.html_words === 'string');
    if (!perMethod && !blocks && typeof answer.html === 'string') {
      const all = el('article', { class: 'heatmap', 'aria-label': 'heatmaps' });
      const tokens = el('div', { class: 'hm-tokens' });
      insertFragment(tokens, answer.html);
      all.append(tokens);
      grid.replaceChildren(all);
    }
    applyUnits();

    const body = $('metrics').querySelector('tbody');
    body.replaceChildren(...answer.methods.map((m, i) => el('tr', { 'data-method': m.name }, [
      el('th', { scope: 'row' }, [el('span', { class: 'swatch', style: `background:${methodColor(i)}` }), m.name]),
      el('td', { class: 'aopc', text: fmt(m.aopc, 4), title: m.curve_note || undefined }),
      el('td', { class: 'sufficiency', text: fmt(m.sufficiency, 4) }),
      el('td', { text: fmt(m.seconds, 3) }),
      el('td', { text: (m.cost || {}).forward ?? '–' }),
      el('td', { text: (m.cost || {}).backward ?? '–' }),
    ])));

    const notes = answer.methods.filter((m) => m.curve_note).map((m) => `${m.name}: ${m.curve_note}`);
    $('metrics-note').textContent = notes.join(' · ');
    $('metrics-note').hidden = !notes.length;
    const series = answer.methods.map((m, i) => m.curve && {
      name: m.name, color: methodColor(i), x: m.curve.fraction, y: m.curve.value, openEnd: true,
    }).filter(Boolean);
    $('curve-card').hidden = !series.length;
    if (series.length) plot($('curve-plot'), series, 'fraction of tokens deleted', `probability of ${target.label ?? 'the prediction'}`);

    renderAgreement(answer);
    $('results').hidden = false;
  }

  function renderAgreement(answer) {
    const table = $('agreement');
    const names = answer.methods.map((m) => m.name);
    const matrix = answer.agreement || [];
    if (names.length < 2 || !matrix.length) {
      table.replaceChildren(el('tbody', {}, [el('tr', {}, [el('td', { class: 'note', text: 'pick two or more methods to compare them' })])]));
      return;
    }
    const head = el('tr', {}, [el('th', {}), ...names.map((n) => el('th', { scope: 'col', text: n }))]);
    const rows = names.map((n, i) => el('tr', {}, [
      el('th', { scope: 'row', text: n }),
      ...names.map((_, j) => el('td', { text: fmt((matrix[i] || [])[j], 2) })),
    ]));
    table.replaceChildren(el('thead', {}, [head]), el('tbody', {}, rows));
  }

  function applyUnits() {
    const units = document.querySelector('input[name="units"]:checked').value;
    const grid = $('heatmaps');
    grid.classList.toggle('only-tokens', units === 'tokens');
    grid.classList.toggle('only-words', units === 'words');
  }

  // ------------------------------------------------------------------ plots (inline SVG)
  function niceTicks(lo, hi, count) {
    if (!(hi > lo)) { hi = lo + 1; lo -= 1; }
    const raw = (hi - lo) / count;
    const mag = 10 ** Math.floor(Math.log10(raw));
    const step = [1, 2, 5, 10].map((s) => s * mag).find((s) => s >= raw) || raw;
    const decimals = Math.max(0, -Math.floor(Math.log10(step)));
    const ticks = [];
    for (let k = Math.ceil(lo / step - 1e-9); k * step <= hi + step * 1e-9; k += 1) ticks.push(Number((k * step).toFixed(decimals)));
    return { ticks, lo: Math.min(lo, ticks[0]), hi: Math.max(hi, ticks[ticks.length - 1]) };
  }

  /** A line plot of ``series`` ([{name, color, x: [..], y: [..], openEnd}]) drawn into
   * ``container``; with ``openEnd`` a point at x = 1 (everything removed) is drawn hollow. */
  function plot(container, series, xLabel, yLabel) {
    const W = 520, H = 280, m = { l: 54, r: 14, t: 12, b: 40 };
    const xs = series.flatMap((s) => s.x), ys = series.flatMap((s) => s.y).filter((v) => Number.isFinite(v));
    const xt = niceTicks(Math.min(0, ...xs), Math.max(1, ...xs), 5);
    const yt = niceTicks(Math.min(...ys), Math.max(...ys), 5);
    const X = (v) => m.l + (v - xt.lo) / (xt.hi - xt.lo) * (W - m.l - m.r);
    const Y = (v) => H - m.b - (v - yt.lo) / (yt.hi - yt.lo) * (H - m.t - m.b);
    const root = svg('svg', { class: 'plot', viewBox: `0 0 ${W} ${H}`, role: 'img', 'aria-label': `${yLabel} against ${xLabel}` });
    for (const v of yt.ticks) {
      root.append(svg('line', { class: 'grid', x1: m.l, x2: W - m.r, y1: Y(v), y2: Y(v) }));
      root.append(svg('text', { x: m.l - 6, y: Y(v) + 4, 'text-anchor': 'end' }, Number(v.toPrecision(6))));
    }
    for (const v of xt.ticks) root.append(svg('text', { x: X(v), y: H - m.b + 16, 'text-anchor': 'middle' }, Number(v.toPrecision(6))));
    root.append(svg('line', { class: 'axis', x1: m.l, x2: W - m.r, y1: H - m.b, y2: H - m.b }));
    root.append(svg('line', { class: 'axis', x1: m.l, x2: m.l, y1: m.t, y2: H - m.b }));
    root.append(svg('text', { x: (m.l + W - m.r) / 2, y: H - 6, 'text-anchor': 'middle' }, xLabel));
    root.append(svg('text', { x: 12, y: (m.t + H - m.b) / 2, 'text-anchor': 'middle', transform: `rotate(-90 12 ${(m.t + H - m.b) / 2})` }, yLabel));
    for (const s of series) {
      const points = s.x.map((x, i) => [x, s.y[i]]).filter(([, y]) => Number.isFinite(y));
      const line = svg('polyline', { class: 'series', stroke: s.color, points: points.map(([x, y]) => `${X(x).toFixed(1)},${Y(y).toFixed(1)}`).join(' ') });
      line.append(svg('title', {}, s.name));
      root.append(line);
      for (const [x, y] of points) {
        const open = s.openEnd && x >= 1;
        const dot = svg('circle', {
          class: open ? 'end' : 'point', cx: X(x).toFixed(1), cy: Y(y).toFixed(1), r: open ? 3.5 : 2.5,
          fill: open ? '#fff' : s.color, stroke: s.color,
        });
        const what = open ? ' (every rankable token removed: the model with no evidence left)' : '';
        dot.append(svg('title', {}, `${s.name}: ${Number(y).toPrecision(4)} at ${Number(x).toPrecision(3)}${what}`));
        root.append(dot);
      }
    }
    const legend = el('div', { class: 'legend' }, series.map((s) => el('span', {}, [el('span', { class: 'swatch', style: `background:${s.color}` }), s.name])));
    container.replaceChildren(root, legend);
  }

  // ------------------------------------------------------------------ generation
  async function generateClicked() {
    if (state.busy) return;
    const r = formRequest();
    if (!r.text.trim()) return showError($('error'), new ApiError('the prompt is empty', 'type a prompt in the text box'));
    if (!r.methods.length) return showError($('error'), new ApiError('no method picked', 'tick a method to attribute the generation with'));
    const request = {
      model: r.model, prompt: r.text, max_new_tokens: Number.parseInt($('max-new-tokens').value, 10) || 8,
      method: r.methods[0], options: r.options[r.methods[0]] || {},
    };
    setBusy(true, 'queued');
    try {
      const answer = await askedJob('generate', request, '/api/generate');
      state.lastGeneration = answer;
      insertFragment($('generation-html'), answer.html);
      $('generation').hidden = false;
    } catch (err) {
      showError($('error'), err);
    } finally {
      setBusy(false);
    }
  }

  // ------------------------------------------------------------------ conversations
  /** The text box read as a conversation: a JSON list of {role, content} messages. */
  function readConversation(text) {
    let messages;
    try {
      messages = JSON.parse(text);
    } catch (err) {
      throw new ApiError('the text is not a JSON conversation', 'paste [{"role": "user", "content": "..."}, ...]');
    }
    if (!Array.isArray(messages) || !messages.length
        || !messages.every((m) => m && typeof m === 'object' && !Array.isArray(m) && 'role' in m)) {
      throw new ApiError('the text is not a list of messages', 'paste [{"role": "system", "content": "..."}, {"role": "user", "content": "..."}, ...]');
    }
    return messages;
  }

  async function conversationClicked() {
    if (state.busy) return;
    const r = formRequest();
    let messages;
    try {
      messages = readConversation(r.text);
    } catch (err) {
      return showError($('error'), err);
    }
    const method = $('conversation-method').value;
    const request = { model: r.model, messages, method, options: r.options[method] || {} };
    const typed = $('conversation-answer').value;
    if (typed.trim()) request.answer = typed;
    setBusy(true, 'queued');
    try {
      const answer = await askedJob('conversation', request, '/api/conversation');
      state.lastConversation = answer;
      renderConversation(answer);
    } catch (err) {
      showError($('error'), err);
    } finally {
      setBusy(false);
    }
  }

  function renderConversation(answer) {
    const top = Math.max(1e-12, ...answer.turns.map((t) => Math.abs(t.share || 0)));
    const rows = answer.turns.map((t) => {
      const share = t.share || 0;
      const bar = el('span', { class: share < 0 ? 'bar negative' : 'bar', style: `width:${(6 * Math.abs(share) / top).toFixed(2)}rem` });
      return el('li', { class: 'turn', 'data-share': share }, [
        el('span', { class: 'role', text: t.role }),
        el('span', { class: 'content', text: t.content }),
        el('span', { class: 'share', title: `score ${fmt(t.score, 4)}` }, [bar, el('span', { text: `${(100 * share).toFixed(1)}%` })]),
      ]);
    });
    rows.push(el('li', { class: 'turn answer' }, [
      el('span', { class: 'role', text: 'assistant' }),
      el('span', { class: 'content', text: answer.answer }),
      el('span', { class: 'share', text: `explained (${answer.answer_from})` }),
    ]));
    $('turns').replaceChildren(...rows);
    $('conversation-summary').textContent = `${answer.model} · ${answer.method} · ${fmt(answer.seconds, 2)} s`;
    $('conversation-result').hidden = false;
  }

  // ------------------------------------------------------------------ causal tracing
  async function traceClicked(event) {
    event.preventDefault();
    if (state.busy) return;
    const byNoise = document.querySelector('input[name="trace-by"]:checked').value === 'corrupt';
    const request = {
      model: $('trace-model').value, prompt: $('trace-prompt').value, kind: $('trace-kind').value,
      window: Number.parseInt($('trace-window').value, 10) || 1, samples: Number.parseInt($('trace-samples').value, 10) || 10,
    };
    if (byNoise) request.corrupt = $('trace-corrupt').value; else request.counterfactual = $('trace-counterfactual').value;
    if ($('trace-target').value) request.target = $('trace-target').value;
    setBusy(true, 'queued');
    $('trace-error').hidden = true;
    try {
      const answer = await runJob('trace', request, '/api/trace');
      state.lastTrace = answer;
      renderTrace(answer);
    } catch (err) {
      showError($('trace-error'), err);
    } finally {
      setBusy(false);
    }
  }

  /** What a hovered cell reads: its layer, token and value (and the other grid's value). */
  function cellText(answer, name, layer, column) {
    const other = name === 'effect' ? 'atp' : 'effect';
    const value = (grid, l, k) => (answer[grid] ? answer[grid][l][k] : null);
    const label = { effect: 'effect', atp: 'AtP' };
    let text = `layer ${layer} · token ${JSON.stringify(answer.columns[column])} · ${label[name]} ${fmtValue(value(name, layer, column))}`;
    if (answer[other]) text += ` (${label[other]} ${fmtValue(value(other, layer, column))})`;
    return text;
  }

  function fmtValue(v) {
    return v === null || v === undefined ? '–' : Number(v).toPrecision(4);
  }

  function traceGrid(answer, name, title) {
    const colors = answer[`${name}_colors`];
    const corrupted = new Set(answer.corrupted);
    const head = el('tr', {}, [el('th', { scope: 'col', text: 'layer' }), ...answer.columns.map((c, k) => el('th', {
      scope: 'col', class: corrupted.has(k) ? 'corrupted' : null, text: corrupted.has(k) ? `${c}*` : c,
    }))]);
    const rows = [];
    for (let layer = answer[name].length - 1; layer >= 0; layer -= 1) {
      rows.push(el('tr', {}, [el('th', { scope: 'row', text: String(layer) }), ...answer[name][layer].map((v, k) => el('td', {
        tabindex: '0', 'data-layer': layer, 'data-column': k, 'data-grid': name,
        'data-value': v === null ? '' : String(v), title: cellText(answer, name, layer, k),
        style: colors[layer][k] ? `background:${colors[layer][k]}` : null,
      }))]));
    }
    const table = el('table', { class: 'trace-grid', 'data-grid': name }, [el('thead', {}, [head]), el('tbody', {}, rows)]);
    const readout = (ev) => {
      const cell = ev.target.closest('td');
      if (cell) $('trace-hover').textContent = cellText(answer, name, Number(cell.dataset.layer), Number(cell.dataset.column));
    };
    table.addEventListener('mouseover', readout);
    table.addEventListener('focusin', readout);
    return el('figure', { class: 'card' }, [el('figcaption', { text: title }), table]);
  }

  function renderTrace(answer) {
    const how = answer.counterfactual === null ? `noise on ${answer.corrupted.length} token(s), ${answer.samples} sample(s)`
      : `counterfactual ${JSON.stringify(answer.counterfactual)}`;
    $('trace-summary').replaceChildren(
      'Model ', el('b', { text: answer.model }), ' · target ', el('b', { text: answer.target }),
      ` · ${answer.metric} clean ${fmtValue(answer.clean_score)}, corrupted ${fmtValue(answer.corrupted_score)} · ${how}`,
      answer.atp ? ` · Spearman(effect, AtP) ${fmt(answer.spearman, 2)}` : '',
      answer.complete ? '' : ' · incomplete: blank cells were not computed',
    );
    const kind = { residual: 'hidden state', attn: 'attention output', mlp: 'MLP output' }[answer.kind] || answer.kind;
    const window = answer.window > 1 ? ` (${answer.window} layers per cell)` : '';
    const grids = [traceGrid(answer, 'effect', `Indirect effect of restoring each ${kind}${window}`)];
    if (answer.atp) grids.push(traceGrid(answer, 'atp', 'Attribution patching (AtP) estimate'));
    $('trace-grids').replaceChildren(...grids);
    $('trace-hover').textContent = 'hover a cell';
    $('trace-result').hidden = false;
  }

  // ------------------------------------------------------------------ steering
  async function steerClicked(event) {
    event.preventDefault();
    if (state.busy) return;
    const request = {
      model: $('steer-model').value, prompt: $('steer-prompt').value, positive: $('steer-positive').value,
      negative: $('steer-negative').value, layer: Number.parseInt($('steer-layer').value, 10) || 0,
      coefficient: Number($('steer-coefficient').value), max_new_tokens: Number.parseInt($('steer-tokens').value, 10) || 20,
    };
    setBusy(true, 'queued');
    $('steer-error').hidden = true;
    try {
      const answer = await runJob('steer', request, '/api/steer');
      $('steer-summary').replaceChildren('Model ', el('b', { text: answer.model }),
        ` · contrastive vector at ${answer.where} (norm ${fmt(answer.norm, 2)}), coefficient ${answer.coefficient} · greedy`);
      $('steer-without').replaceChildren(answer.prompt, el('b', { text: answer.without }));
      $('steer-with').replaceChildren(answer.prompt, el('b', { text: answer.with }));
      $('steer-result').hidden = false;
    } catch (err) {
      showError($('steer-error'), err);
    } finally {
      setBusy(false);
    }
  }

  // ------------------------------------------------------------------ downloads
  let cssText = null;

  async function styleSheet() {
    if (cssText === null) {
      try { cssText = await (await fetch('/static/app.css')).text(); } catch (err) { cssText = ''; }
    }
    return cssText;
  }

  function download(name, type, content) {
    const url = URL.createObjectURL(new Blob([content], { type }));
    const a = el('a', { href: url, download: name });
    document.body.append(a);
    a.click();
    a.remove();
    setTimeout(() => URL.revokeObjectURL(url), 1000);
  }

  function fileStem() {
    const model = (state.lastRequest && state.lastRequest.model) || $('model').value || 'heedful';
    return `heedful-${model.replace(/[^A-Za-z0-9_.-]+/g, '_')}`;
  }

  /** The shown section as a standalone page: the page's own stylesheet inline, no scripts
   * except the renderer's (generation hover), no network. */
  async function downloadHtml(section, stem) {
    const copy = section.cloneNode(true);
    copy.querySelectorAll('.downloads, .view-toggle').forEach((n) => n.remove());
    copy.hidden = false;
    const doc = document.implementation.createHTMLDocument('heedful');
    const meta = doc.createElement('meta');
    meta.setAttribute('charset', 'utf-8');
    doc.head.prepend(meta);
    const style = doc.createElement('style');
    style.textContent = await styleSheet();
    doc.head.append(style);
    doc.body.className = 'app';
    const main = doc.createElement('main');
    main.append(doc.importNode(copy, true));
    doc.body.append(main);
    download(`${stem}.html`, 'text/html', '<!DOCTYPE html>\n' + doc.documentElement.outerHTML);
  }

  // ------------------------------------------------------------------ runs
  async function loadRuns() {
    const body = $('runs').querySelector('tbody');
    try {
      const runs = await api('/api/runs');
      body.replaceChildren(...runs.map((r) => {
        const row = el('tr', { tabindex: '0', 'data-run': r.id }, [
          el('td', { text: r.id }), el('td', { text: r.model }), el('td', { text: r.dataset }),
          el('td', { text: Array.isArray(r.methods) ? r.methods.join(', ') : r.methods }),
          el('td', { text: r.n }), el('td', { text: r.created }),
        ]);
        row.addEventListener('click', () => openRun(r.id));
        row.addEventListener('keydown', (ev) => { if (ev.key === 'Enter' || ev.key === ' ') { ev.preventDefault(); openRun(r.id); } });
        return row;
      }));
      $('runs-empty').hidden = runs.length > 0;
    } catch (err) {
      showError($('run-error'), err);
    }
  }

  async function openRun(id) {
    $('run-error').hidden = true;
    try {
      const run = await api(`/api/runs/${encodeURIComponent(id)}`);
      state.lastRun = { id, ...run };
      for (const row of $('runs').querySelectorAll('tbody tr')) row.setAttribute('aria-selected', String(row.dataset.run === id));
      $('run-title').textContent = `Run ${id}`;
      renderRunTable(run.table || []);
      const curves = Object.entries(run.curves || {}).map(([name, c], i) => ({ name, color: methodColor(i), x: c.fraction, y: c.value }));
      $('run-curves-title').textContent = `Mean ${run.curve_metric || 'deletion'} curves over the run's examples`;
      if (curves.length) plot($('run-curves'), curves, 'fraction of tokens', `${run.curve_metric || 'output'} (mean)`);
      else $('run-curves').replaceChildren(el('p', { class: 'note', text: 'this run stored no curves' }));
      $('run').hidden = false;
      writeHash();
    } catch (err) {
      showError($('run-error'), err);
    }
  }

  function renderRunTable(table) {
    const methods = [...new Set(table.map((r) => r.method))];
    const metrics = [...new Set(table.map((r) => r.metric))];
    const cell = new Map(table.map((r) => [`${r.method}\u0000${r.metric}`, r]));
    const head = el('tr', {}, [el('th', { scope: 'col', text: 'method' }), ...metrics.map((m) => el('th', { scope: 'col', text: m }))]);
    const rows = methods.map((method) => el('tr', {}, [
      el('th', { scope: 'row', text: method }),
      ...metrics.map((metric) => {
        const r = cell.get(`${method}\u0000${metric}`);
        return el('td', { text: r ? `${fmt(r.mean, 3)} [${fmt(r.low, 3)}, ${fmt(r.high, 3)}]` : '–' });
      }),
    ]));
    $('run-table').replaceChildren(el('thead', {}, [head]), el('tbody', {}, rows));
  }

  // ------------------------------------------------------------------ views
  let runsLoaded = false;

  const VIEWS = ['explain', 'trace', 'steer', 'runs'];

  function showView(name) {
    state.view = name;
    for (const view of VIEWS) {
      $(`view-${view}`).hidden = view !== name;
      $(`tab-${view}`).setAttribute('aria-selected', String(view === name));
    }
    if (name === 'runs' && !runsLoaded) { runsLoaded = true; loadRuns(); }
    writeHash();
  }

  function countText() {
    $('text-count').textContent = String($('text').value.length);
  }

  // ------------------------------------------------------------------ wiring
  function wire() {
    $('form').addEventListener('submit', explain);
    $('model').addEventListener('change', () => { modelChanged().catch((err) => showError($('error'), err)); });
    $('text').addEventListener('input', () => { countText(); writeHash(); });
    $('target-kind').addEventListener('change', () => { targetKindChanged(); writeHash(); });
    for (const id of ['target-label', 'target-token', 'contrast-a', 'contrast-b', 'contrast-a-text', 'contrast-b-text', 'curve']) {
      $(id).addEventListener('change', writeHash);
    }
    $('methods').addEventListener('change', writeHash);
    $('method-filter').addEventListener('input', filterMethods);
    $('generate').addEventListener('click', generateClicked);
    $('conversation').addEventListener('click', conversationClicked);
    $('download-conv-json').addEventListener('click', () => state.lastConversation && download(`${fileStem()}-conversation.json`,
      'application/json', JSON.stringify(state.lastConversation, null, 2)));
    document.querySelectorAll('input[name="units"]').forEach((r) => r.addEventListener('change', applyUnits));
    for (const view of VIEWS) $(`tab-${view}`).addEventListener('click', () => showView(view));
    $('trace-form').addEventListener('submit', traceClicked);
    $('steer-form').addEventListener('submit', steerClicked);
    $('download-trace-json').addEventListener('click', () => state.lastTrace && download('heedful-trace.json',
      'application/json', JSON.stringify(state.lastTrace, null, 2)));
    $('download-json').addEventListener('click', () => state.last && download(`${fileStem()}.json`, 'application/json',
      JSON.stringify({ request: state.lastRequest, response: state.last }, null, 2)));
    $('download-html').addEventListener('click', () => downloadHtml($('results'), fileStem()));
    $('download-gen-json').addEventListener('click', () => state.lastGeneration && download(`${fileStem()}-generation.json`,
      'application/json', JSON.stringify(state.lastGeneration, null, 2)));
    $('download-gen-html').addEventListener('click', () => downloadHtml($('generation'), `${fileStem()}-generation`));
    $('download-run-json').addEventListener('click', () => state.lastRun && download(`heedful-run-${state.lastRun.id}.json`,
      'application/json', JSON.stringify(state.lastRun, null, 2)));
    window.addEventListener('hashchange', () => {
      if (location.hash !== state.writtenHash) applyHash().catch((err) => showError($('error'), err));
    });
  }

  async function start() {
    wire();
    try {
      await applyHash();
      document.body.dataset.ready = 'true';
    } catch (err) {
      showError($('error'), err);
    }
  }

  start();
})();
