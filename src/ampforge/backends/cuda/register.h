// Internal to backends/cuda: the registration function of each kernel family (called from
// register_cuda.cpp) and the helpers families share.
#pragma once

namespace ampforge {
class Tensor;
}

namespace ampforge::cuda {

// Every family below (register_cuda_backend() calls it once a device exists; registration only stores function
// pointers, so a test may call it without one).
void register_kernels_cuda();

void register_elementwise_cuda();  // elementwise.cu: fill, copy (with copy.cpp), arange, binary, compare, where
void register_unary_cuda();        // unary.cu: unary ops and the elementwise backward ops
void register_random_cuda();       // random.cu: rand_uniform, rand_normal, dropout
void register_reduce_cuda();       // reduce.cu: sum, mean, amax, amin, argmax, argmin, var
void register_softmax_cuda();      // softmax.cu: softmax, log_softmax, cross_entropy, bce_with_logits (+ backward)
void register_optim_cuda();        // optim.cu: adamw_step, sgd_step, amp_unscale, amp_update_scale
void register_blas_cuda();         // blas.cpp: matmul, linear (cuBLASLt)
void register_conv_cuda();         // conv.cpp: conv2d and its backward ops (cuDNN; nothing without it)
void register_copy_cuda();         // copy.cpp: the copy op, within a device and across devices
void register_pool_cuda();         // pool.cu: max/avg/adaptive-avg pooling, nearest upsampling (+ backward)
void register_norm_cuda();         // norm.cu: batch_norm, layer_norm (+ backward)
void register_embedding_cuda();    // embedding.cu: embedding, embedding_backward
void register_attention_cuda();    // attention.cu: attention, attention_backward (flash-style, deterministic)

// Library handles and persistent workspaces of `device`, created now if they do not exist yet: called
// before a CUDA graph capture begins (creating them inside one would be captured or invalidate it).
void prepare_blas(int device);   // blas.cpp: the cuBLASLt handle and workspace
void prepare_cudnn(int device);  // conv.cpp: the cuDNN handle (nothing without cuDNN)

// dst <- src on one CUDA device (both tensors there): broadcasting, any strides, any dtype conversion.
void copy_on_device(const Tensor& dst, const Tensor& src);
// Fills t (on a CUDA device) with `value` converted to its dtype.
void fill_on_device(const Tensor& t, double value);

}  // namespace ampforge::cuda
