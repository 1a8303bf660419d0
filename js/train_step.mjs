// Trains a model with a step exported by ort_train_core.export_training_step, in
// Node.js with onnxruntime-node or with onnxruntime-web's WebAssembly backend (the one
// browsers run).
//
//   node train_step.mjs STEP.onnx INITIAL.onnx DATA_DIR STEPS node|web OUT.json
//
// STEP.onnx     step_without_defaults(step): its learning rate and state are required
//               inputs
// INITIAL.onnx  step_initial_state_model(step): no inputs, outputs the initial learning
//               rate and state
// DATA_DIR      manifest.json, {"<input>": {"file", "type", "dims": [batches, ...]}}
//               (the dims after the batch count are a batch's), and one raw
//               little-endian file per data input (X: float32, label: int64)
// OUT.json      {"losses": [...], "state": {"<input>": {"type", "dims", "data"}}} after
//               the last step
import { readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';

const [stepFile, initialFile, dataDir, steps, backend, outFile] = process.argv.slice(2);
const ort = await import(backend === 'web' ? 'onnxruntime-web' : 'onnxruntime-node');
const ARRAYS = {
  float32: Float32Array,
  float64: Float64Array,
  int32: Int32Array,
  int64: BigInt64Array,
};

const step = await ort.InferenceSession.create(stepFile);
const initial = await ort.InferenceSession.create(initialFile);
// The contract: an output `<name>_new` is the next step's value of the input `<name>`.
const state = step.outputNames
  .filter((n) => n.endsWith('_new'))
  .map((n) => n.slice(0, -'_new'.length));
// An input that has an initializer (a default value) is not in inputNames:
// onnxruntime-node would ignore a value fed for it (the step would train nothing),
// onnxruntime-web refuses it.
const fed = [...new Set([...state, ...initial.outputNames])];
const defaulted = fed.filter((n) => !step.inputNames.includes(n));
if (defaulted.length > 0) {
  throw new Error(
    `${stepFile}: the inputs ${defaulted.join(', ')} have a default value ` +
      '(an initializer), which onnxruntime-node uses instead of the value fed: ' +
      'export the step with ort_train_core.step_without_defaults(step) and its ' +
      'start with step_initial_state_model(step)',
  );
}

// The batches: step i reads the i-th slice of each data file (from the first again
// after the last).
const manifest = JSON.parse(readFileSync(join(dataDir, 'manifest.json'), 'utf8'));
const data = Object.entries(manifest).map(([name, { file, type, dims }]) => {
  const bytes = new Uint8Array(readFileSync(join(dataDir, file)));
  const values = new ARRAYS[type](bytes.buffer);
  const size = values.length / dims[0];
  return { name, type, values, batches: dims[0], dims: dims.slice(1), size };
});

// learning_rate and the state, named as the step's inputs
const feeds = await initial.run({});
const losses = [];
for (let i = 0; i < Number(steps); i++) {
  for (const { name, type, values, batches, dims, size } of data) {
    const start = (i % batches) * size;
    feeds[name] = new ort.Tensor(type, values.subarray(start, start + size), dims);
  }
  const outputs = await step.run(feeds);
  // the first output: the loss
  losses.push(Number(outputs[step.outputNames[0]].data[0]));
  for (const name of state) feeds[name] = outputs[`${name}_new`];
}

// The last state by input name, int64 values (Adam's step count) as numbers.
const last = {};
for (const name of state) {
  const { type, dims, data } = feeds[name];
  last[name] = { type, dims, data: Array.from(data, Number) };
}
writeFileSync(outFile, JSON.stringify({ losses, state: last }));
