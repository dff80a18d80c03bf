// Unit tests of the extension's pure logic, run with node's test runner (`npm test`).
import assert from 'node:assert/strict';
import { test } from 'node:test';

import {
  activeRunsText,
  attachSource,
  carryControls,
  chipState,
  completeFinetune,
  gpuTooltip,
  keysFor,
  KeyMap,
  groupRuns,
  matchesFilter,
  objectiveOf,
  parentPath,
  progressFraction,
  progressLine,
  sparklinePath,
  startedText,
  stepsText,
  waitingText
} from '../src/logic';

const KEYS: KeyMap = {
  model: { type: ['string'], enum: null },
  method: { type: ['string'], enum: ['auto', 'full', 'lora', 'qlora'] },
  objective: { type: ['string'], enum: ['sft', 'dpo'] },
  lora: { type: ['object'], enum: null },
  'lora.r': { type: ['integer'], enum: null, description: 'rank' },
  'lora.bias': { type: ['string'], enum: ['none', 'all', 'lora_only'] },
  train: { type: ['object'], enum: null },
  'train.learning_rate': { type: ['number'], enum: null },
  'train.packing': { type: ['boolean'], enum: null }
};
const OBJECTIVES: { [o: string]: KeyMap } = {
  dpo: {
    'train.learning_rate': { type: ['number'], enum: null },
    'train.beta': { type: ['number'], enum: null },
    'train.loss_type': { type: ['string'], enum: ['sigmoid', 'ipo'] }
  }
};

/** Completion labels with the cursor at the end of ``text``. */
function labels(text: string): string[] {
  return completeFinetune(text, text.length, KEYS, OBJECTIVES).items.map(i => i.label);
}

test('top-level keys are offered on an empty line of a %%finetune cell', () => {
  assert.deepEqual(labels('%%finetune\nmo'), ['model']);
  assert.deepEqual(labels('%%finetune --name x\nl'), ['lora']);
});

test('nothing is offered outside a %%finetune cell or on the magic line', () => {
  assert.deepEqual(labels('print(1)\nmo'), []);
  assert.deepEqual(labels('%%finetune'), []);
});

test('nested keys follow the indentation of their block', () => {
  assert.deepEqual(labels('%%finetune\nlora:\n  '), ['bias', 'r']);
  assert.deepEqual(labels('%%finetune\nlora:\n  r: 8\nmethod: lora\nlo'), ['lora']);
  const text = '%%finetune\nlora:\n  b';
  const r = completeFinetune(text, text.length, KEYS);
  assert.equal(r.start, text.length - 1); // the typed prefix is replaced
  assert.equal(r.items[0].insertText, 'bias: ');
});

test('enum values are offered after a key', () => {
  assert.deepEqual(labels('%%finetune\nmethod: q'), ['qlora']);
  assert.deepEqual(labels('%%finetune\nlora:\n  bias: '), ['none', 'all', 'lora_only']);
  assert.deepEqual(labels('%%finetune\nlora:\n  r: '), []);
});

test('train keys follow the objective the cell names', () => {
  assert.deepEqual(labels('%%finetune\ntrain:\n  '), ['learning_rate', 'packing']);
  const dpo = '%%finetune\nobjective: dpo\ntrain:\n  ';
  assert.deepEqual(labels(dpo), ['beta', 'learning_rate', 'loss_type']);
  assert.deepEqual(labels(dpo + 'loss_type: i'), ['ipo']);
  // An objective the server does not know keeps the common keys rather than offering nothing.
  assert.deepEqual(labels('%%finetune\nobjective: zzz\ntrain:\n  '), ['learning_rate', 'packing']);
});

test('objectiveOf reads only a top-level objective key', () => {
  assert.equal(objectiveOf('%%finetune\nobjective: dpo # pairs\n'), 'dpo');
  assert.equal(objectiveOf("%%finetune\nobjective: 'kto'\n"), 'kto');
  assert.equal(objectiveOf('%%finetune\ntrain:\n  objective: dpo\n'), null);
  assert.equal(keysFor('%%finetune\n', KEYS, OBJECTIVES), KEYS);
});

test('parentPath walks up through enclosing blocks only', () => {
  const lines = ['data:', '  columns:', '    prompt: q', '  format: auto', 'lora:', '  r: 8'];
  assert.deepEqual(parentPath(lines, 2), ['lora']);
  assert.deepEqual(parentPath(lines.slice(0, 3), 4), ['data', 'columns']);
  assert.deepEqual(parentPath(lines, 0), []);
});

test('sparkline spans the box with the highest loss at the top', () => {
  const d = sparklinePath([4, 2, 1], 80, 18);
  assert.equal(d, 'M0.0 1.0 L40.0 11.7 L80.0 17.0');
  assert.equal(sparklinePath([1], 80, 18), '');
  assert.equal(sparklinePath([], 80, 18), '');
  // A flat loss draws a line instead of dividing by zero; a NaN (diverged step) is skipped.
  assert.match(sparklinePath([2, 2], 80, 18), /^M0\.0 \d+\.\d L80\.0 \d+\.\d$/);
  assert.equal(sparklinePath([3, NaN, 1], 80, 18).split('L').length, 2);
});

test('progress is clamped and unknown lengths read as 0', () => {
  assert.equal(progressFraction(5, 10), 0.5);
  assert.equal(progressFraction(12, 10), 1);
  assert.equal(progressFraction(5, null), 0);
  assert.equal(stepsText(5, 10), 'step 5/10');
  assert.equal(stepsText(5, null), 'step 5');
  assert.equal(stepsText(1401, 100000), 'step 1,401/100,000'); // the dashboard's separators
});

test("a run's line adds the server's time left and first loss, leaving out what it did not send", () => {
  assert.equal(
    progressLine('step 2/100', '32 min 40 s left', 'first loss at step 5, in about 60 s'),
    'step 2/100 · 32 min 40 s left · first loss at step 5, in about 60 s'
  );
  assert.equal(progressLine('step 40/100', '1 min 30 s left', null), 'step 40/100 · 1 min 30 s left');
  assert.equal(progressLine('step 1/100', null, 'first loss at step 5'), 'step 1/100 · first loss at step 5');
  assert.equal(progressLine('step 1/100', undefined, undefined), 'step 1/100');
});

test('a start time reads short, in local time, with the year only when it is not this one', () => {
  const now = new Date(2025, 5, 15, 18, 0);
  const at = (d: Date) => d.getTime() / 1000;
  assert.equal(startedText(at(new Date(2025, 5, 15, 9, 5)), now), 'today 09:05');
  assert.equal(startedText(at(new Date(2025, 0, 3, 14, 30)), now), '3 Jan 14:30');
  assert.equal(startedText(at(new Date(2024, 11, 31, 23, 59)), now), '31 Dec 2024 23:59');
  assert.equal(startedText(null, now), '');
});

test('the filter matches every word in the name, id, state or folder', () => {
  const run = { id: '20250101-000000-gemma-ab12', name: 'gemma-lora', state: 'stopped', folder: 'runs' };
  assert.ok(matchesFilter(run, ''));
  assert.ok(matchesFilter(run, 'GEMMA'));
  assert.ok(matchesFilter(run, 'lora stopped'));
  assert.ok(matchesFilter(run, 'ab12'));
  assert.ok(!matchesFilter(run, 'lora running'));
});

test('the filter matches the model a run trains too', () => {
  const run = { id: 'r-1', name: 'identity', state: 'running', folder: 'runs', model: 'SmolLM2-135M-Instruct' };
  assert.ok(matchesFilter(run, 'smollm2'));
  assert.ok(matchesFilter(run, 'identity smollm2'));
  assert.ok(!matchesFilter(run, 'qwen'));
});

test('runs Resume can continue get a group of their own between the active and the finished ones', () => {
  const runs = [
    { id: 'a', done: false, resumable: false },
    { id: 'b', done: true, resumable: true },
    { id: 'c', done: true, resumable: false },
    { id: 'd', done: true, resumable: true }
  ];
  const g = groupRuns(runs);
  assert.deepEqual(
    [g.active, g.resumable, g.finished].map(xs => xs.map(r => r.id)),
    [['a'], ['b', 'd'], ['c']]
  );
});

test('an ended run whose model server still runs is listed with the active runs, and counted', () => {
  const runs = [
    { id: 'a', done: false, resumable: false, server: null },
    { id: 'b', done: true, resumable: false, server: { url: 'http://127.0.0.1:8000/v1' } },
    { id: 'c', done: true, resumable: true, server: { url: 'http://127.0.0.1:8001/v1' } },
    { id: 'd', done: true, resumable: false, server: null }
  ];
  const g = groupRuns(runs);
  assert.deepEqual(
    [g.active, g.resumable, g.finished].map(xs => xs.map(r => r.id)),
    [['a', 'b', 'c'], [], ['d']]
  );
  assert.equal(activeRunsText(1, 2), 'nbtrain: 1 active run · 2 model servers');
  assert.equal(activeRunsText(0, 0), 'nbtrain: 0 active runs');
});

test('the GPU tooltip says there is no NVIDIA GPU instead of NVML error text', () => {
  assert.equal(
    gpuTooltip([], 'no NVIDIA driver (NVML Shared Library Not Found)'),
    'No NVIDIA GPU on this machine'
  );
  assert.equal(gpuTooltip([], null), 'No NVIDIA GPU on this machine');
  assert.match(gpuTooltip([], 'Insufficient Permissions'), /^GPU memory cannot be read: /);
  const gpu = { index: 0, name: 'H100', memory_used: 2 * 1024 ** 3, memory_total: 80 * 1024 ** 3 };
  assert.equal(gpuTooltip([gpu], null), 'GPU 0 H100: 2.0 GiB / 80 GiB in use');
});

test('the attach cell loads the extension first unless the kernel has the magics', () => {
  assert.equal(attachSource('r-1', true), '%finetune attach r-1');
  assert.equal(attachSource('r-1', false), '%load_ext nbtrain\n%finetune attach r-1');
  assert.equal(attachSource('r-1', null), '%load_ext nbtrain\n%finetune attach r-1');
});

test('a view with no logged step says what the run is doing, in the dashboard\'s words', () => {
  assert.equal(waitingText('starting', null), 'starting the training process');
  assert.equal(waitingText('starting', 'tokenising 400 rows'), 'tokenising 400 rows');
  assert.equal(waitingText('running', null), 'training: waiting for the first logged step');
  assert.equal(waitingText('queued', null), 'queued: waiting to start');
  assert.equal(waitingText('weird', null), 'weird');
});

test('a run being stopped reads stopping until it has stopped', () => {
  assert.equal(chipState('running', true), 'stopping');
  assert.equal(chipState('stopping', true), 'stopping');
  assert.equal(chipState('running', false), 'running');
  assert.equal(chipState('stopped', true), 'stopped'); // a poll that saw the end first
  assert.equal(chipState('queued', true), 'queued'); // a queued job is cancelled, not stopped after a step
});

// The loss panel's controls as nbtrain.ui.figures.axes.loss_controls makes them.
function lossFigure(): { data: { [k: string]: unknown }[]; layout: { [k: string]: unknown } } {
  return {
    data: [{ name: 'loss', opacity: 1 }, { name: 'smoothed', visible: false, opacity: 1 }, { name: 'lr' }],
    layout: {
      yaxis: { title: { text: 'loss' } },
      updatemenus: [
        {
          name: 'loss-curve',
          active: 0,
          buttons: [
            { label: 'raw', method: 'restyle', args: [{ visible: [true, false], opacity: [1, 1] }, [0, 1]] },
            { label: 'smoothed', method: 'restyle', args: [{ visible: [true, true], opacity: [0.3, 1] }, [0, 1]] }
          ]
        },
        {
          name: 'loss-scale',
          active: 0,
          buttons: [
            { label: 'linear', method: 'relayout', args: [{ 'yaxis.type': 'linear' }] },
            { label: 'log', method: 'relayout', args: [{ 'yaxis.type': 'log' }] }
          ]
        }
      ]
    }
  };
}

test('carryControls keeps the log scale and the smoothed loss chosen on the drawn figure', () => {
  const fresh = lossFigure();
  carryControls([{ name: 'loss-curve', active: 1 }, { name: 'loss-scale', active: 1 }], fresh);
  const menus = fresh.layout.updatemenus as { active: number }[];
  assert.deepEqual(menus.map(m => m.active), [1, 1]);
  assert.deepEqual(fresh.layout.yaxis, { title: { text: 'loss' }, type: 'log' });
  assert.deepEqual(fresh.data[0], { name: 'loss', opacity: 0.3, visible: true });
  assert.deepEqual(fresh.data[1], { name: 'smoothed', visible: true, opacity: 1 });
  assert.deepEqual(fresh.data[2], { name: 'lr' }); // a trace no button names is left alone
});

test('carryControls leaves a fresh figure as it is when nothing was chosen or nothing was drawn', () => {
  for (const previous of [undefined, [{ name: 'loss-curve', active: 0 }], [{ name: 'other', active: 1 }]]) {
    const fresh = lossFigure();
    carryControls(previous, fresh);
    assert.deepEqual(fresh, lossFigure());
  }
});
