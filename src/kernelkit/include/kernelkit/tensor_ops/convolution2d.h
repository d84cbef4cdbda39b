// kernelkit/tensor_ops/convolution2d.h: mpp::tensor_ops::convolution2d, as MPPTensorOpsConvolution2d.h
// declares it.
//
//   constexpr auto desc = convolution2d_descriptor(int4(O, W, H, N), int4(C, SW, SH, SN), int2(KW, KH),
//       convolution2d_activation_layout::nhwc, convolution2d_weights_layout::hwio,
//       int2(stride_x, stride_y), int2(dilation_x, dilation_y), groups = 1, relaxed_precision, mode);
//   convolution2d<desc, execution_simdgroups<N>> op;
//   op.set_offsets(int2(x, y));                // where the tile's windows are in the activation
//   op.run(activation, weights, destination);  // destination (+)= the convolution
//
// Tensors are rank 4, innermost first: activation NHWC, extents (C, W, H, N); weights HWIO,
// (O, C, KW, KH); destination NHWO, (O, W, H, N), or a cooperative tensor from
// get_destination_cooperative_tensor. The op computes the tile destination_dimensions (O, W, H, N):
// element (o, x, y, n) is the sum over ky < KH, kx < KW, c < C of
//   activation(c, sx, sy, n) * weights(o, c, kx, ky),  sx = offset.x + x * stride.x + kx * dilation.x - ax,
// sy likewise, with C source_dimensions.x (where it is not positive: the activation's extent 0). The
// window is centred: ax = ceil((KW - 1) * dilation.x / 2), which Apple's header leaves unsaid and
// kernels written for Apple's GPUs measure (with the default offset 0, a stride-1 convolution is a
// "same" one). Padding is what lies outside the activation: as for matmul2d, elements past a
// tensor's extents (or before its origin) read as zero and destination elements past its extents are
// not written. Apple's static_asserts are kept (one layout each, groups == 1; the scope
// execution_simdgroups<N>, as Apple's documentation asks). relaxed_precision changes nothing here.
//
// The path: the convolution as a matrix product (implicit GEMM) whose rows are the tile's pixels
// p = x + W * (y + H * n), its columns the channels o, and k = c + C * (kx + KW * ky), on the loops
// path (loops.h) in layout.h's destination layout over (p, o); the cooperative destination holds
// that layout, its coordinates (o, x, y, n).
#pragma once

namespace kk {
namespace tops {

// The descriptor's int2 and int4 (MSL vectors in Apple's header): structural, as a template argument
// needs, and built from either dialect's vectors (MSL's int4, CUDA's int4) or from {x, y...}.
struct ivec2 {
  int x, y;
  constexpr KK_FN ivec2(int x_, int y_) : x(x_), y(y_) {}
  template <class V>
    requires requires(const V& v) { v.x; v.y; }
  constexpr KK_FN ivec2(const V& v) : x(int(v.x)), y(int(v.y)) {}
};
struct ivec4 {
  int x, y, z, w;
  constexpr KK_FN ivec4(int x_, int y_, int z_, int w_) : x(x_), y(y_), z(z_), w(w_) {}
  template <class V>
    requires requires(const V& v) { v.x; v.y; v.z; v.w; }
  constexpr KK_FN ivec4(const V& v) : x(int(v.x)), y(int(v.y)), z(int(v.z)), w(int(v.w)) {}
};

}  // namespace tops
}  // namespace kk

namespace mpp {
namespace tensor_ops {

enum class convolution2d_activation_layout { nhwc };
enum class convolution2d_weights_layout { hwio };

struct convolution2d_descriptor {
  enum class mode {
    multiply,             // destination = the convolution
    multiply_accumulate,  // destination += the convolution
  };

  // .x output channels, .y width, .z height, .w batch (source_dimensions: .x input channels)
  kk::tops::ivec4 destination_dimensions;
  kk::tops::ivec4 source_dimensions;
  kk::tops::ivec2 kernel_dimensions;  // .x width, .y height
  convolution2d_activation_layout activation_layout;
  convolution2d_weights_layout weights_layout;
  kk::tops::ivec2 strides;
  kk::tops::ivec2 dilations;
  int groups;
  bool relaxed_precision;
  mode conv2d_mode;

  constexpr KK_FN convolution2d_descriptor(
      kk::tops::ivec4 _destination_dimensions, kk::tops::ivec4 _source_dimensions, kk::tops::ivec2 _kernel_dimensions,
      convolution2d_activation_layout _activation_layout = convolution2d_activation_layout::nhwc,
      convolution2d_weights_layout _weights_layout = convolution2d_weights_layout::hwio,
      kk::tops::ivec2 _strides = kk::tops::ivec2(1, 1), kk::tops::ivec2 _dilations = kk::tops::ivec2(1, 1),
      int _groups = 1, bool _relaxed_precision = false, mode _convolution2d_mode = mode::multiply)
      : destination_dimensions(_destination_dimensions), source_dimensions(_source_dimensions),
        kernel_dimensions(_kernel_dimensions), activation_layout(_activation_layout), weights_layout(_weights_layout),
        strides(_strides), dilations(_dilations), groups(_groups), relaxed_precision(_relaxed_precision),
        conv2d_mode(_convolution2d_mode) {}
};

enum class convolution2d_cooperative_operand { destination };

}  // namespace tensor_ops
}  // namespace mpp

namespace kk {
namespace tops {

// A convolution's destination: layout.h's destination layout over (pixel p, channel o) of an
// O x (W * H * N) tile, its coordinates (o, x, y, n), innermost first as the destination tensor's.
template <int O, int WD, int HD, int ND, int W>
struct conv_layout : layout<role::destination, WD * HD * ND, O, W> {
  static constexpr int rank = 4, coords_size = 4;
  KK_FN static void coords(int i, int (&c)[coords_size]) {
    int p, o;
    conv_layout::at(i, p, o);
    c[0] = o, c[1] = p % WD, c[2] = p / WD % HD, c[3] = p / (WD * HD);
  }
};
template <int O, int WD, int HD, int ND, int W> inline constexpr bool is_layout_v<conv_layout<O, WD, HD, ND, W>> = true;

// Element (i0, i1, i2, i3) of a rank-4 tensor, zero outside it.
template <class Tn>
KK_FN auto element_or_zero(const Tn& t, int i0, int i1, int i2, int i3) {
  using V = typename Tn::value_type;
  const int i[4] = {i0, i1, i2, i3};
  for (int d = 0; d < 4; ++d)
    if (i[d] < 0 || i[d] >= int(t.get_extent(d))) return V();
  return V(t(i0, i1, i2, i3));
}

// The operands as the product's matrices, read by the loops path as tensors (operands.h): the
// activation is the left matrix (extents K x M: element (k, p) is what tap k of pixel p reads), the
// weights the right one (held N x K: element (o, k)). C: input channels; (x0, y0): the source
// position of pixel (0, 0)'s first tap.
template <mpp::tensor_ops::convolution2d_descriptor D, class Act>
struct conv_windows {
  static constexpr int KW = D.kernel_dimensions.x, KH = D.kernel_dimensions.y;
  static constexpr int WD = D.destination_dimensions.y, HD = D.destination_dimensions.z, ND = D.destination_dimensions.w;
  const Act& a;
  int C, x0, y0;
  KK_FN int get_extent(int r) const { return r == 0 ? C * KW * KH : WD * HD * ND; }
  KK_FN auto operator()(int k, int p) const {
    const int c = k % C, kx = k / C % KW, ky = k / (C * KW);
    const int x = p % WD, y = p / WD % HD, n = p / (WD * HD);
    return element_or_zero(a, c, x0 + x * D.strides.x + kx * D.dilations.x, y0 + y * D.strides.y + ky * D.dilations.y,
                           n);
  }
};
template <mpp::tensor_ops::convolution2d_descriptor D, class Wt>
struct conv_weights {
  static constexpr int KW = D.kernel_dimensions.x, KH = D.kernel_dimensions.y;
  const Wt& w;
  int C;
  KK_FN int get_extent(int r) const { return r == 0 ? D.destination_dimensions.x : C * KW * KH; }
  KK_FN auto operator()(int o, int k) const { return element_or_zero(w, o, k % C, k / C % KW, k / (C * KW)); }
};
template <mpp::tensor_ops::convolution2d_descriptor D, class Act>
struct operand_traits<conv_windows<D, Act>> {
  using value_type = typename Act::value_type;
  static constexpr bool scaled = false;
};
template <mpp::tensor_ops::convolution2d_descriptor D, class Wt>
struct operand_traits<conv_weights<D, Wt>> {
  using value_type = typename Wt::value_type;
  static constexpr bool scaled = false;
};

}  // namespace tops
}  // namespace kk

namespace mpp {
namespace tensor_ops {

template <convolution2d_descriptor Descriptor, class Scope, class... ConvArgs>
class convolution2d {
  static_assert(Descriptor.activation_layout == convolution2d_activation_layout::nhwc,
                "only nhwc activation layout supported currently");
  static_assert(Descriptor.weights_layout == convolution2d_weights_layout::hwio,
                "only hwio weights layout supported currently");
  static_assert(Descriptor.groups == 1, "only group size 1 supported currently");
  static_assert(metal::is_execution_simdgroups_v<Scope>,
                "convolution2d: the scope must be execution_simdgroups<N> (the threadgroup's SIMD-groups)");
  static_assert(Descriptor.destination_dimensions.x > 0 && Descriptor.destination_dimensions.y > 0 &&
                    Descriptor.destination_dimensions.z > 0 && Descriptor.destination_dimensions.w > 0,
                "convolution2d: the descriptor's destination_dimensions must be positive");
  static_assert(Descriptor.kernel_dimensions.x > 0 && Descriptor.kernel_dimensions.y > 0 && Descriptor.strides.x > 0 &&
                    Descriptor.strides.y > 0 && Descriptor.dilations.x > 0 && Descriptor.dilations.y > 0,
                "convolution2d: the descriptor's kernel_dimensions, strides and dilations must be positive");
  using layout = kk::tops::conv_layout<Descriptor.destination_dimensions.x, Descriptor.destination_dimensions.y,
                                       Descriptor.destination_dimensions.z, Descriptor.destination_dimensions.w,
                                       int(Scope::static_size)>;

  kk::tops::ivec2 offset = {0, 0};

 public:
  template <class ActivationOperandType, class WeightsOperandType, class ElementType, class CoordType = int>
  using cooperative_tensor_destination_t = metal::cooperative_tensor<ElementType, metal::dextents<CoordType, 4>, layout>;

  template <class ActivationOperandType, class WeightsOperandType, class ElementType, class CoordType = int>
  KK_FN cooperative_tensor_destination_t<ActivationOperandType, WeightsOperandType, ElementType, CoordType>
  get_destination_cooperative_tensor() const {
    static_assert(!metal::is_tensor_v<ElementType> && !kk::tops::is_cooperative_v<ElementType> &&
                      kk::tops::is_integer_v<CoordType>,
                  "get_destination_cooperative_tensor<Activation, Weights, ElementType>: ElementType must be an element type");
    return {};
  }

  KK_FN void set_offsets(kk::tops::ivec2 o) { offset = o; }

  // (Apple's takes lvalues; kernelkit also takes a slice made in the call.)
  template <class Activation, class Weights, class Dest>
  KK_FN void run(Activation&& activation, Weights&& weights, Dest&& destination,
                 kk::site s = KK_TOPS_SITE("convolution2d::run")) const {
    using kk::tops::remove_reference_t;
    run_on<remove_reference_t<Activation>, remove_reference_t<Weights>, remove_reference_t<Dest>>(activation, weights,
                                                                                                  destination, s);
  }

 private:
  template <class Activation, class Weights, class Dest>
  KK_FN void run_on(const Activation& activation, const Weights& weights, Dest& destination, const kk::site& s) const {
    using namespace kk::tops;
    static_assert(metal::is_tensor_v<Activation>, "Activation must be a tensor");
    static_assert(metal::is_tensor_v<Weights>, "Weights must be a tensor");
    static_assert(metal::is_tensor_v<Dest> || is_cooperative_v<Dest>, "Destination must be a tensor or cooperative tensor");
    static_assert(Activation::get_rank() == 4, "Activation must be rank 4");
    static_assert(Weights::get_rank() == 4, "Weights must be rank 4");
    static_assert(remove_const_t<Dest>::get_rank() == 4, "Destination must be rank 4");
    static_assert(!operand_traits<Activation>::scaled && !operand_traits<Weights>::scaled,
                  "convolution2d::run: operands with a scales plane are not supported");
    check_scope(int(Scope::static_size), s);
    using DV = typename operand_traits<Dest>::value_type;
    using Acc = accumulator_t<typename Activation::value_type, typename Weights::value_type, DV>;
    constexpr bool accumulate = Descriptor.conv2d_mode == convolution2d_descriptor::mode::multiply_accumulate;
    // Each window starts half its span before offset + (x, y) * strides (rounded up: see the top).
    const int C = Descriptor.source_dimensions.x > 0 ? Descriptor.source_dimensions.x : int(activation.get_extent(0));
    const conv_windows<Descriptor, Activation> left{
        activation, C, offset.x - ((Descriptor.kernel_dimensions.x - 1) * Descriptor.dilations.x + 1) / 2,
        offset.y - ((Descriptor.kernel_dimensions.y - 1) * Descriptor.dilations.y + 1) / 2};
    const conv_weights<Descriptor, Weights> right{weights, C};

    Acc acc[layout::capacity] = {};
    if constexpr (is_cooperative_v<Dest>) {
      static_assert(is_same_v<typename Dest::layout, layout>,
                    "convolution2d::run: the destination cooperative tensor is not this op's");
      if constexpr (accumulate) convert_all(acc, destination.v);
    } else if constexpr (accumulate) {
      staged_io<layout, Acc>::load(acc, destination);
    }
    constexpr matmul2d_descriptor product(layout::outer, layout::inner);
    loops_matmul<Acc, product, layout, decltype(left), decltype(right)>::run(acc, left, right, left.get_extent(0), s);
    if constexpr (is_cooperative_v<Dest>) convert_all(destination.v, acc);
    else staged_io<layout, Acc>::store(acc, destination);
  }
};

}  // namespace tensor_ops
}  // namespace mpp
