// dnn.cu — NVIDIA's cuDNN, unmodified, on Orion: a handle, tensor descriptors, and a ReLU forward
// activation on a 2x8x16x16 FP32 tensor. Statuses must be success and the input must read back
// byte for byte; the output is checked only where kernels run (a GPU). lib_marks.h marks the call.
#include <cudnn.h>

#include "lib_marks.h"

using ot::check;
using ot::fmt;

#define DNN_OK(name, expr)                                                                                       \
  do {                                                                                                           \
    cudnnStatus_t s_ = (expr);                                                                                   \
    if (!check(name, s_ == CUDNN_STATUS_SUCCESS, fmt("%s (%d)", cudnnGetErrorString(s_), static_cast<int>(s_)))) \
      return ot::finish();                                                                                       \
  } while (0)

int main() {
  ot::detect_device();
  const int n = 2, c = 8, h = 16, w = 16, count = n * c * h * w;
  std::vector<float> x(count), y(count, 7.f);
  for (int i = 0; i < count; ++i) x[i] = static_cast<float>(i % 9) - 4.f;
  float* dx = static_cast<float*>(ot::upload(x.data(), count * 4));
  float* dy = static_cast<float*>(ot::upload(y.data(), count * 4));
  cudnnHandle_t dnn = nullptr;
  DNN_OK("dnn_create", cudnnCreate(&dnn));
  cudnnTensorDescriptor_t t = nullptr;
  DNN_OK("tensor_desc", cudnnCreateTensorDescriptor(&t));
  DNN_OK("tensor_set", cudnnSetTensor4dDescriptor(t, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, n, c, h, w));
  cudnnActivationDescriptor_t act = nullptr;
  DNN_OK("act_desc", cudnnCreateActivationDescriptor(&act));
  DNN_OK("act_set", cudnnSetActivationDescriptor(act, CUDNN_ACTIVATION_RELU, CUDNN_NOT_PROPAGATE_NAN, 0.0));
  const float alpha = 1.f, beta = 0.f;
  ot::mark(1, "relu_forward");
  DNN_OK("relu_forward", cudnnActivationForward(dnn, act, &alpha, t, dx, &beta, t, dy));
  check("relu_sync", cudaDeviceSynchronize() == cudaSuccess);
  ot::check_device_bytes("relu_input_intact", dx, x.data(), count * 4);
  CUDA_OK(cudaMemcpy(y.data(), dy, count * 4, cudaMemcpyDeviceToHost));
  int bad = 0;
  for (int i = 0; i < count; ++i) bad += y[i] != (x[i] > 0 ? x[i] : 0.f);
  ot::check_sass_kernel("relu_result", bad == 0, fmt("%d entries wrong", bad));
  cudnnDestroyActivationDescriptor(act);
  cudnnDestroyTensorDescriptor(t);
  DNN_OK("dnn_destroy", cudnnDestroy(dnn));
  return ot::finish();
}
