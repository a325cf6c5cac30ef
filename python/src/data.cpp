// ampforge.data: the C++ data sets (Fashion-MNIST from Debian's dataset-fashion-mnist, as `ampforge train` reads it;
// MNIST; synthetic; the CLI's data sets by name), Python data sets (any object with __len__ and __getitem__ returning
// (x, label)) seen by the engine as a data::Dataset, and the C++ DataLoader (seeded shuffling, normalisation,
// worker threads) as a Python iterable of (x, y).
#include <cstring>
#include <mutex>

#include "common.h"

#include "ampforge/data/dataset_factory.h"

namespace ampforge::python {

namespace {

using af::data::Dataset;

// A Python data set as a data::Dataset. get() and label() take the GIL; a loader that reads it from worker threads
// works (the thread that waits for batches releases the GIL), but gains nothing over reading on the calling thread.
class PythonDataset final : public Dataset {
 public:
  explicit PythonDataset(nb::handle obj) : obj_(obj) {
    n_ = static_cast<int64_t>(nb::len(obj));
    if (n_ == 0) throw nb::value_error("the data set is empty");
    const auto [x, y] = item(0);
    shape_ = x.shape();
    if (shape_.empty()) shape_ = af::Shape{1};
    // getattr_static: a subclass of ampforge.data.Dataset must not run the C++ base's properties (never constructed).
    nb::object get_static = nb::module_::import_("inspect").attr("getattr_static");
    nb::object n = get_static(obj, "num_classes", nb::none()), c = get_static(obj, "classes", nb::none());
    if (PyLong_Check(n.ptr())) classes_ = nb::cast<int64_t>(n);
    else if (PySequence_Check(c.ptr())) classes_ = static_cast<int64_t>(nb::len(c));
    name_ = nb::type_name(obj.type()).c_str();
  }
  int64_t size() const override { return n_; }
  af::Shape example_shape() const override { return shape_; }
  int64_t num_classes() const override { return classes_; }
  using Dataset::get;
  void get(int64_t i, float* dst) const override {
    nb::gil_scoped_acquire gil;
    auto [x, y] = item(i);
    if (x.numel() != af::shape_numel(shape_))
      throw nb::value_error(("data set item " + std::to_string(i) + " has shape " + x.shape().str() +
                             "; item 0 had " + shape_.str() + " (every example must have the same shape)").c_str());
    const af::Tensor c = x.to(af::DType::F32).contiguous();
    std::memcpy(dst, c.data_ptr(), static_cast<size_t>(c.numel()) * sizeof(float));
    last_ = {this, i, y};
  }
  int64_t label(int64_t i) const override {
    if (last_.owner == this && last_.index == i) return last_.label;  // get() just read it on this thread
    nb::gil_scoped_acquire gil;
    return item(i).second;
  }
  std::string name() const override { return name_; }

 private:
  // item i as (a CPU tensor, the label).
  std::pair<af::Tensor, int64_t> item(int64_t i) const {
    nb::object it = obj_.get()[nb::int_(i)];
    if (!PyTuple_Check(it.ptr()) && !PyList_Check(it.ptr()))
      throw nb::type_error("a data set's __getitem__ must return (example, label)");
    nb::sequence seq = nb::borrow<nb::sequence>(it);
    if (nb::len(seq) < 2) throw nb::type_error("a data set's __getitem__ must return (example, label)");
    nb::object x = seq[0], y = seq[1];
    af::Tensor t;
    if (nb::isinstance<af::Tensor>(x)) {
      t = nb::cast<af::Tensor>(x).detach();
      if (!t.device().is_cpu()) t = t.to(af::kCPU);
    } else {
      nb::object a = nb::module_::import_("numpy").attr("ascontiguousarray")(x, nb::arg("dtype") = "float32");
      t = nb::cast<af::Tensor>(nb::module_::import_("ampforge").attr("from_numpy")(a)).clone();
    }
    int64_t label = 0;
    if (nb::isinstance<af::Tensor>(y)) label = static_cast<int64_t>(nb::cast<af::Tensor>(y).item());
    else label = nb::cast<int64_t>(nb::int_(y));
    return {t, label};
  }

  PyObjectRef obj_;
  int64_t n_ = 0, classes_ = 0;
  af::Shape shape_;
  std::string name_;
  struct Last {
    const PythonDataset* owner = nullptr;
    int64_t index = -1, label = 0;
  };
  static thread_local Last last_;
};
thread_local PythonDataset::Last PythonDataset::last_;

// A data::Dataset for a Python object: itself when it is an ampforge data set, else a PythonDataset over it.
std::shared_ptr<const Dataset> as_dataset(nb::handle obj) {
  // A Python subclass of ampforge.data.Dataset that defines __len__/__getitem__ (and never constructed the C++ base)
  // is a Python data set.
  if (nb::isinstance<Dataset>(obj) && nb::inst_ready(obj)) return nb::cast<std::shared_ptr<Dataset>>(obj);
  if (!nb::hasattr(obj, "__len__") || !nb::hasattr(obj, "__getitem__"))
    throw nb::type_error("expected an ampforge data set or an object with __len__ and __getitem__");
  return std::make_shared<PythonDataset>(obj);
}

struct Loader {
  std::shared_ptr<const Dataset> dataset;
  af::data::LoaderOptions options;
  std::unique_ptr<af::data::DataLoader> loader;
  int64_t epoch = -1;
};

struct LoaderIter {
  Loader* owner;
};

}  // namespace

std::shared_ptr<const af::data::Dataset> dataset_from_python(nb::handle obj) { return as_dataset(obj); }

void init_data(nb::module_& m) {
  nb::class_<Dataset>(m, "Dataset", "A C++ data set: len(ds), ds[i] -> (example tensor, label).")
      .def("__len__", &Dataset::size)
      .def("__getitem__",
           [](const Dataset& d, int64_t i) {
             if (i < 0) i += d.size();
             if (i < 0 || i >= d.size()) throw nb::index_error("data set index out of range");
             af::Tensor x = af::Tensor::empty(d.example_shape(), af::DType::F32);
             {
               EngineCall call;
               d.get(i, x.data<float>());
             }
             return nb::make_tuple(x, d.label(i));
           })
      .def_prop_ro("example_shape", [](const Dataset& d) { return shape_tuple(d.example_shape()); })
      .def_prop_ro("num_classes", &Dataset::num_classes)
      .def_prop_ro("name", &Dataset::name)
      .def_prop_ro("normalization",
                   [](const Dataset& d) {
                     const af::data::Normalization n = d.normalization();
                     return nb::make_tuple(n.mean, n.std);
                   },
                   "(mean, std) per channel (or one value for all), the constants the CLI normalises with.");

  nb::class_<af::data::MnistDataset, Dataset>(m, "_MnistDataset")
      .def("__init__",
           [](af::data::MnistDataset* self, const std::string& dir, bool train, const std::string& name) {
             EngineCall call;
             new (self) af::data::MnistDataset(dir, train, name);
           },
           nb::arg("root"), nb::arg("train") = true, nb::arg("name") = "fashion-mnist");
  m.def("default_fashion_mnist_dir", &af::data::default_fashion_mnist_dir,
        "$AMPFORGE_FASHION_MNIST_DIR, else where Debian's dataset-fashion-mnist installs the files.");

  nb::class_<af::data::SyntheticDataset, Dataset>(m, "SyntheticDataset",
                                                  "Deterministic random images (learnable: the label shifts channel 0).")
      .def("__init__",
           [](af::data::SyntheticDataset* self, int64_t size, nb::handle shape, int64_t classes, uint64_t seed) {
             new (self) af::data::SyntheticDataset(size, shape_from_sequence(shape, "example_shape"), classes, seed);
           },
           nb::arg("size"), nb::arg("example_shape"), nb::arg("num_classes") = 10, nb::arg("seed") = 0);

  m.def("dataset_splits",
        [](const std::string& name, const std::string& data_dir, int64_t image_size, int64_t channels, uint64_t seed) {
          af::data::DatasetSpec spec;
          spec.name = name, spec.data_dir = data_dir, spec.image_size = image_size, spec.channels = channels;
          spec.seed = seed;
          af::data::DatasetSplits s;
          {
            EngineCall call;
            s = af::data::make_dataset_splits(spec);
          }
          return nb::make_tuple(s.train, s.test ? nb::cast(s.test) : nb::none());
        },
        nb::arg("name"), nb::arg("data_dir") = "", nb::arg("image_size") = 0, nb::arg("channels") = 1,
        nb::arg("seed") = 0, "(train, test) of a data set by the name `ampforge train --dataset` takes.");

  nb::class_<LoaderIter>(m, "_LoaderIter")
      .def("__iter__", [](nb::handle self) { return nb::borrow(self); })
      .def("__next__", [](LoaderIter& it) {
        std::optional<af::data::Batch> b;
        {
          EngineCall call;
          b = it.owner->loader->next();
        }
        if (!b) throw nb::stop_iteration();
        return nb::make_tuple(b->x, b->y);
      });

  nb::class_<Loader>(m, "DataLoader",
                     "Batches of (x, y) from a data set: x (B, *example_shape) float32, normalised; y (B) int64. "
                     "Shuffling depends only on (seed, epoch); each iteration is the next epoch.")
      .def("__init__",
           [](Loader* self, nb::handle dataset, int64_t batch_size, bool shuffle, bool drop_last, int num_workers,
              uint64_t seed, std::optional<std::vector<float>> mean, std::optional<std::vector<float>> std_,
              bool normalize, bool channels_last, std::optional<af::Device> device, int64_t crop_padding,
              bool hflip) {
             auto ds = as_dataset(dataset);
             af::data::LoaderOptions o;
             o.batch_size = batch_size, o.shuffle = shuffle, o.drop_last = drop_last, o.seed = seed;
             o.workers = num_workers;
             const af::data::Normalization n = ds->normalization();
             o.mean = mean.value_or(n.mean);
             o.std = std_.value_or(n.std);
             o.normalize = normalize;
             o.format = channels_last ? af::MemoryFormat::ChannelsLast : af::MemoryFormat::Contiguous;
             o.device = device.value_or(af::kCPU);
             o.crop_padding = crop_padding, o.hflip = hflip;
             new (self) Loader{ds, o, nullptr, -1};
             EngineCall call;
             self->loader = std::make_unique<af::data::DataLoader>(ds, o);
           },
           nb::arg("dataset"), nb::arg("batch_size") = 1, nb::arg("shuffle") = false, nb::arg("drop_last") = false,
           nb::arg("num_workers") = 0, nb::arg("seed") = 0, nb::arg("mean") = nb::none(), nb::arg("std") = nb::none(),
           nb::arg("normalize") = true, nb::arg("channels_last") = false, nb::arg("device") = nb::none(),
           nb::arg("crop_padding") = 0, nb::arg("hflip") = false,
           "mean/std default to the data set's own constants (Fashion-MNIST's, as the CLI uses; none for Python "
           "data sets). num_workers threads build batches ahead (0: on the calling thread).")
      .def("__len__", [](const Loader& l) { return l.loader->num_batches(); })
      .def("__iter__",
           [](Loader& l) {
             ++l.epoch;
             EngineCall call;
             l.loader->start_epoch(l.epoch);
             return LoaderIter{&l};
           },
           nb::keep_alive<0, 1>())
      .def("set_epoch", [](Loader& l, int64_t e) { l.epoch = e - 1; }, nb::arg("epoch"),
           "The next iteration is epoch `epoch` (its shuffle and augmentation).")
      .def_prop_ro("batch_size", [](const Loader& l) { return l.options.batch_size; })
      .def_prop_ro("dataset", [](const Loader& l) { return l.dataset; })
      .def_prop_ro("wait_seconds", [](const Loader& l) { return l.loader->wait_seconds(); });
}

}  // namespace ampforge::python
