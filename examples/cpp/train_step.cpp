// Trains a model with a step exported by ort_train_core.export_training_step, with
// nothing but the onnxruntime C++ API.
//
//   train_step STEP.onnx DATA_DIR STEPS OUT_DIR
//
// STEP.onnx  the exported step as it is: the learning rate and the state are inputs
//            with a default value (an initializer), which the C/C++ API lets us
//            override
// DATA_DIR   one raw little-endian file per data input, <input>.bin (X.bin, label.bin),
//            holding its batches one after the other; step i reads batch i (from the
//            first after the last)
// OUT_DIR    gets <input>.bin, the raw values of each state input after the last step
// It prints the loss of each step.
#include <onnxruntime_cxx_api.h>

#include <cstdlib>
#include <fstream>
#include <iostream>
#include <iterator>
#include <stdexcept>
#include <string>
#include <vector>

struct Data {  // one data input: all its batches and the shape of one
  std::string name;
  ONNXTensorElementDataType type;
  std::vector<int64_t> shape;
  std::vector<char> bytes;
  size_t batch_bytes;
};

static size_t element_size(ONNXTensorElementDataType type) {
  switch (type) {
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_DOUBLE:
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64: return 8;
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT:
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32: return 4;
    default:
      throw std::runtime_error("unsupported element type " + std::to_string(type));
  }
}

static std::vector<char> read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read " + path);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

int main(int argc, char** argv) {
  if (argc != 5) {
    std::cerr << "usage: " << argv[0] << " STEP.onnx DATA_DIR STEPS OUT_DIR\n";
    return 2;
  }
  const std::string data_dir = argv[2], out_dir = argv[4];
  const int steps = std::atoi(argv[3]);
  // ERROR, not WARNING: onnxruntime warns of every initializer that is also an input
  Ort::Env env(ORT_LOGGING_LEVEL_ERROR, "train_step");
  Ort::Session session(env, argv[1], Ort::SessionOptions{});
  Ort::AllocatorWithDefaultOptions allocator;

  // The data: the inputs without an initializer (the state's are "overridable
  // initializers").
  std::vector<Data> data;
  for (size_t i = 0; i < session.GetInputCount(); ++i) {
    Ort::TypeInfo type_info = session.GetInputTypeInfo(i);  // owns what info points to
    auto info = type_info.GetTensorTypeAndShapeInfo();
    Data d{session.GetInputNameAllocated(i, allocator).get(), info.GetElementType(),
           info.GetShape(), {}, 0};
    d.bytes = read_file(data_dir + "/" + d.name + ".bin");
    // the batch size is fixed
    d.batch_bytes = info.GetElementCount() * element_size(d.type);
    data.push_back(std::move(d));
  }
  // The contract: an output <name>_new is the next step's value of the input <name>.
  std::vector<std::string> outputs, state;
  for (size_t i = 0; i < session.GetOutputCount(); ++i) {
    outputs.push_back(session.GetOutputNameAllocated(i, allocator).get());
    const std::string& name = outputs.back();
    if (name.size() > 4 && name.compare(name.size() - 4, 4, "_new") == 0)
      state.push_back(name.substr(0, name.size() - 4));
  }

  auto memory = Ort::MemoryInfo::CreateCpu(OrtArenaAllocator, OrtMemTypeDefault);
  // empty until the first step: the defaults
  std::vector<Ort::Value> values(state.size());
  for (int i = 0; i < steps; ++i) {
    std::vector<const char*> in_names;
    std::vector<Ort::Value> inputs;
    for (Data& d : data) {
      const size_t batches = d.bytes.size() / d.batch_bytes;
      char* batch = d.bytes.data() + (i % batches) * d.batch_bytes;
      in_names.push_back(d.name.c_str());
      inputs.push_back(Ort::Value::CreateTensor(
          memory, batch, d.batch_bytes, d.shape.data(), d.shape.size(), d.type));
    }
    // feeds the previous step's outputs
    for (size_t k = 0; i > 0 && k < state.size(); ++k) {
      in_names.push_back(state[k].c_str());
      inputs.push_back(std::move(values[k]));
    }
    std::vector<const char*> out_names;
    for (const std::string& name : outputs) out_names.push_back(name.c_str());
    auto results = session.Run(Ort::RunOptions{}, in_names.data(), inputs.data(),
                               inputs.size(), out_names.data(), out_names.size());
    std::cout << "step " << i << " loss " << *results[0].GetTensorData<float>() << "\n";
    // the _new outputs, in state's order
    for (size_t j = 0, k = 0; j < outputs.size(); ++j)
      if (k < state.size() && outputs[j] == state[k] + "_new")
        values[k++] = std::move(results[j]);
  }

  for (size_t k = 0; k < state.size() && steps > 0; ++k) {  // the final state, raw
    auto info = values[k].GetTensorTypeAndShapeInfo();
    std::ofstream out(out_dir + "/" + state[k] + ".bin", std::ios::binary);
    out.write(static_cast<const char*>(values[k].GetTensorRawData()),
              info.GetElementCount() * element_size(info.GetElementType()));
  }
  return 0;
}
