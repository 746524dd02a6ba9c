#!/usr/bin/python3
"""The ONNX models of the ONNX Runtime execution provider's tests and benchmarks, and their reference.

Run it with /usr/bin/python3: it needs Debian's python3-onnx (1.12) and python3-numpy
(scripts/ort-args installs them); another python3 first on PATH may have neither.

  make_models.py --out DIR [--seed N] [--only NAME...]      the test models + DIR/manifest.json
  make_models.py --out DIR --big [--dim D --hidden H --layers L] [--only big_mlp big_nbits]
  make_models.py --check DIR --model NAME --outputs FILE [--batch B --seq S --input-seed N]
                 [--rtol X --atol Y]

Every weight is drawn from --seed (default 1) and the model's name, so a model's bytes depend on
neither --only nor the order models are written in. Models are IR version 8, opset 17, plus
com.microsoft version 1 where a contrib op (Gelu, MatMulNBits) is used. NAME.onnx embeds its
weights; NAME.ext.onnx keeps them in NAME.ext.onnx.data (external data: ONNX Runtime maps that
file, so weights seen by a provider stay where they are for the session's lifetime).

--check recomputes a model's outputs in float64 with numpy (a tiny interpreter of the ops used
here; MatMulNBits is dequantized exactly as ONNX Runtime does) from the inputs
weightcache-ort-host feeds it, and compares them with the raw outputs the host wrote with --out.
Exit status 0 within tolerance, 3 outside it, 1 on a usage error.

The host's inputs, which --check regenerates (see input_values): input number i of the session
(graph input order), element j, gets splitmix64(seed ^ (i + 1) * 0xD1B54A32D192ED03 +
(j + 1) * 0x9E3779B97F4A7C15), top 24 bits, mapped to [-1, 1): exact in float32. Symbolic dims:
"batch" takes --batch, "seq" takes --seq, any other name batch*seq (the rows of a 2-D input).
"""

import argparse
import json
import math
import os
import sys
import zlib

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
import onnx.mapping  # onnx 1.12 (Debian 12): helper.tensor_dtype_to_np_dtype came later

IR_VERSION = 8
OPSET = 17
MS_DOMAIN = "com.microsoft"
DEFAULT_BATCH, DEFAULT_SEQ = 2, 3

MODELS = ["mlp", "gemm", "gemm_nobias", "gemm_relu", "shared_weight", "matmul_input_b", "odd_shapes",
          "matmulnbits", "bias_rank3", "gemm_tiny_alpha", "nbits_negative_scale", "reshape_opset9",
          "reshape_opset9_bad_k", "constant_weights", "if_branches", "declined", "vector_input",
          "loop_body", "cnn", "conv1d", "dq_mlp", "gemm_unknown_rank_1d", "conv_empty_width",
          "conv_add_bias", "scan_body", "mmi_mlp", "mmi_mlp_7bit", "mmi_negative_scale", "nonfinite", "mmi_zero_1x1",
          "mmi_scale_underflow", "quant_inf_row", "quant_tiny_rows", "quant_rows"]
BIG_MODELS = ["big_mlp", "big_nbits"]
# More benchmark models, written only when named (--only): a dynamically quantized int8 MLP of
# the same shape, and a ResNet-50-shaped CNN (--dim/--hidden/--layers do not apply to it).
EXTRA_BIG_MODELS = ["big_dq", "big_mmi", "big_resnet"]


# ---------------------------------------------------------------------------------------------
# Building blocks
# ---------------------------------------------------------------------------------------------

def rng_for(seed, name):
    # One stream per (seed, model): --only or a new model never changes another model's weights.
    return np.random.default_rng([seed, zlib.crc32(name.encode())])


def dense(rng, k, n):
    # Scaled like a trained layer's weights (variance 1/k) so activations stay O(1) layer after layer.
    return (rng.standard_normal((k, n), dtype=np.float32) / np.float32(math.sqrt(k))).astype(np.float32)


def vec(rng, n, scale=0.1):
    return (rng.standard_normal(n, dtype=np.float32) * np.float32(scale)).astype(np.float32)


def quantize_blocks(rng, k, n, block):
    """Random 4-bit weights in MatMulNBits' layout: B uint8 [N, K/block, block/2] (element 2i in
    the low nibble, 2i+1 in the high one), scales f32 [N * K/block], zero point 8 (the default)."""
    assert k % block == 0 and block % 2 == 0
    blocks = k // block
    # q in 1..15, so q - 8 is symmetric (-7..7): with 0..15 every weight would lean by -0.5 and
    # activations would grow layer after layer (8 layers: 1e7). Scaled to variance ~1/k like dense().
    q = rng.integers(1, 16, size=(n, blocks, block), dtype=np.uint8)
    b = (q[:, :, 0::2] | (q[:, :, 1::2] << 4)).astype(np.uint8)
    scales = (rng.uniform(0.75, 1.25, size=n * blocks) / (4.32 * math.sqrt(k))).astype(np.float32)
    return b, scales


def dequantize_nbits(b, scales, k, n, block, zero_point=8):
    """W [K, N] float64 from MatMulNBits' B and scales: (q - zero_point) * scale, per block of K."""
    blocks = k // block
    low = (b & 0x0F).astype(np.int32)
    high = (b >> 4).astype(np.int32)
    q = np.empty((n, blocks, block), dtype=np.int32)
    q[:, :, 0::2] = low
    q[:, :, 1::2] = high
    w = (q - zero_point).astype(np.float64) * scales.reshape(n, blocks, 1).astype(np.float64)
    return w.reshape(n, k).T


class Graph:
    """Collects nodes and initializers for one model."""

    def __init__(self, name):
        self.name = name
        self.nodes, self.inits, self.inputs, self.outputs = [], [], [], []
        self.uses_ms = False
        self.counter = 0

    def tmp(self, prefix):
        self.counter += 1
        return f"{prefix}_{self.counter}"

    def init(self, name, array):
        self.inits.append(numpy_helper.from_array(array, name))
        return name

    def input(self, name, shape, elem=TensorProto.FLOAT):
        self.inputs.append(helper.make_tensor_value_info(name, elem, shape))
        return name

    def output(self, name, shape, elem=TensorProto.FLOAT):
        self.outputs.append(helper.make_tensor_value_info(name, elem, shape))
        return name

    def node(self, op, inputs, outputs=None, domain="", **attrs):
        if domain == MS_DOMAIN:
            self.uses_ms = True
        outputs = outputs or [self.tmp(op.lower())]
        self.nodes.append(helper.make_node(op, inputs, outputs, name=self.tmp(op), domain=domain, **attrs))
        return outputs[0]

    def graph(self):
        """The GraphProto alone (an If branch: no inputs, outer-scope values by name)."""
        return helper.make_graph(self.nodes, self.name, self.inputs, self.outputs, initializer=self.inits)

    def model(self, opset=OPSET):
        graph = self.graph()
        opsets = [helper.make_opsetid("", opset)]
        if self.uses_ms:
            opsets.append(helper.make_opsetid(MS_DOMAIN, 1))
        m = helper.make_model(graph, opset_imports=opsets, producer_name="weightcache make_models.py")
        m.ir_version = IR_VERSION
        return m


def matmul_nbits(g, x, w_b, w_scales, k, n, block=32):
    return g.node("MatMulNBits", [x, w_b, w_scales], domain=MS_DOMAIN, K=k, N=n, bits=4, block_size=block,
                  accuracy_level=0)


def seven_bit(q, scale):
    """int8 weights in 7 bits (quantize_dynamic's reduce_range), the scale doubled: ORT's u8s8
    kernels without VNNI saturate a 16-bit sum of two products with full-range weights
    (255 x 127 x 2 > 32767), so the models compared with its CPU provider use these."""
    return np.clip(np.round(q.astype(np.float32) / 2), -64, 63).astype(np.int8), (scale * 2).astype(np.float32)


def dynamic_quantize(g, x):
    """DynamicQuantizeLinear of x: [uint8 A, its scale, its zero point]."""
    outs = [g.tmp("xq"), g.tmp("xscale"), g.tmp("xzero")]
    g.node("DynamicQuantizeLinear", [x], outs)
    return outs


def matmul_integer(g, xq, b, b_scale, b_zero=None, out=None):
    """A MatMul as quantize_dynamic writes it by default (QOperator): MatMulInteger of the quantized
    A xq = [A, its scale, its zero point] and the int8 weights b, Cast to float, then Mul by
    Mul(A's scale, b_scale)."""
    t = g.node("MatMulInteger", [xq[0], b, xq[2]] + ([b_zero] if b_zero else []))
    t = g.node("Cast", [t], to=TensorProto.FLOAT)
    return g.node("Mul", [t, g.node("Mul", [xq[1], b_scale])], [out] if out else None)


# ---------------------------------------------------------------------------------------------
# The models (each returns a Graph; `ext` says whether an external-data copy is written too)
# ---------------------------------------------------------------------------------------------

def build_mlp(seed):
    rng, g = rng_for(seed, "mlp"), Graph("mlp")
    d, h = 64, 256
    x = g.input("X", ["batch", "seq", d])
    t = g.node("MatMul", [x, g.init("W1", dense(rng, d, h))])
    t = g.node("Add", [t, g.init("b1", vec(rng, h))])
    t = g.node("Gelu", [t], domain=MS_DOMAIN)
    t = g.node("MatMul", [t, g.init("W2", dense(rng, h, d))])
    g.node("Add", [t, g.init("b2", vec(rng, d))], ["Y"])
    g.output("Y", ["batch", "seq", d])
    return g


def build_gemm(seed, name="gemm"):
    rng, g = rng_for(seed, name), Graph(name)
    k, n = 96, 80
    a = g.input("A", ["rows", k])
    if name == "gemm":
        g.node("Gemm", [a, g.init("B", dense(rng, k, n).T.copy()), g.init("C", vec(rng, n))], ["Y"],
               alpha=0.75, beta=1.5, transA=0, transB=1)
    elif name == "gemm_nobias":
        g.node("Gemm", [a, g.init("B", dense(rng, k, n))], ["Y"], alpha=1.25, transA=0, transB=0)
    else:  # gemm_relu
        t = g.node("Gemm", [a, g.init("B", dense(rng, k, n).T.copy()), g.init("C", vec(rng, n))], transB=1)
        g.node("Relu", [t], ["Y"])
    g.output("Y", ["rows", n])
    return g


def build_shared_weight(seed):
    # One initializer, two MatMul nodes: a provider keyed by tensor must pack it once.
    rng, g = rng_for(seed, "shared_weight"), Graph("shared_weight")
    d = 64
    x = g.input("X", ["batch", "seq", d])
    w = g.init("W", dense(rng, d, d))
    t = g.node("MatMul", [x, w])
    g.node("MatMul", [t, w], ["Y"])
    g.output("Y", ["batch", "seq", d])
    return g


def build_matmul_input_b(seed):
    # B of the first MatMul is a graph input (not a weight: never to be claimed); the second's is
    # an initializer, so the graph is split between ONNX Runtime's CPU provider and another.
    rng, g = rng_for(seed, "matmul_input_b"), Graph("matmul_input_b")
    k, n, n2 = 32, 16, 24
    x = g.input("X", ["batch", "seq", k])
    b = g.input("B", [k, n])
    t = g.node("MatMul", [x, b])
    g.node("MatMul", [t, g.init("W", dense(rng, n, n2))], ["Y"])
    g.output("Y", ["batch", "seq", n2])
    return g


def build_odd_shapes(seed):
    # K and N that fit no vector width, a 4-D activation, and a one-column N.
    rng, g = rng_for(seed, "odd_shapes"), Graph("odd_shapes")
    k, n = 13, 7
    x = g.input("X", [2, 3, 5, k])
    g.node("MatMul", [x, g.init("W", dense(rng, k, n))], ["Y"])
    g.node("MatMul", [x, g.init("W1", dense(rng, k, 1))], ["Y1"])
    g.output("Y", [2, 3, 5, n])
    g.output("Y1", [2, 3, 5, 1])
    return g


def build_matmulnbits(seed):
    rng, g = rng_for(seed, "matmulnbits"), Graph("matmulnbits")
    k, n, block = 128, 96, 32
    x = g.input("A", ["batch", "seq", k])
    b, scales = quantize_blocks(rng, k, n, block)
    t = matmul_nbits(g, x, g.init("B_q4", b), g.init("B_scales", scales), k, n, block)
    g.node("Add", [t, g.init("bias", vec(rng, n))], ["Y"])
    g.output("Y", ["batch", "seq", n])
    return g


def build_bias_rank3(seed):
    # A bias Add with more dimensions than the activation: Add's output gains them ([1, m, 20]),
    # so fusing it into the layer would give the wrong shape.
    rng, g = rng_for(seed, "bias_rank3"), Graph("bias_rank3")
    k, n = 24, 20
    x = g.input("X", ["rows", k])
    t = g.node("MatMul", [x, g.init("W", dense(rng, k, n))])
    g.node("Add", [t, g.init("b", vec(rng, n).reshape(1, 1, n))], ["Y"])
    g.output("Y", [1, "rows", n])
    return g


def build_gemm_tiny_alpha(seed):
    # beta * C / alpha overflows float: a provider that folds alpha into the bias gets inf.
    rng, g = rng_for(seed, "gemm_tiny_alpha"), Graph("gemm_tiny_alpha")
    k, n = 32, 16
    a = g.input("A", ["rows", k])
    g.node("Gemm", [a, g.init("B", dense(rng, k, n).T.copy()), g.init("C", vec(rng, n))], ["Y"],
           alpha=1e-39, beta=1.0, transB=1)
    g.output("Y", ["rows", n])
    return g


def build_nbits_negative_scale(seed):
    # XNNPACK's blockwise 4-bit kernels take only positive scales; MatMulNBits allows any.
    rng, g = rng_for(seed, "nbits_negative_scale"), Graph("nbits_negative_scale")
    k, n, block = 64, 32, 32
    x = g.input("A", ["batch", "seq", k])
    b, scales = quantize_blocks(rng, k, n, block)
    scales = scales.copy()
    scales[::3] *= -1
    matmul_nbits(g, x, g.init("B_q4", b), g.init("B_scales", scales), k, n, block)
    g.nodes[-1].output[0] = "Y"
    g.output("Y", ["batch", "seq", n])
    return g


def build_reshape_opset9(seed, name="reshape_opset9"):
    # As paddle2onnx and older exporters write it: a Reshape whose shape is computed (here from
    # Shape, Slice and Concat) at opset 9, whose shape inference then gives the MatMul's A no rank.
    # reshape_opset9_bad_k reshapes to rows of 32 for a weight of K 64: no provider can run it,
    # and one that took the MatMul must fail the run with an error, not read past A.
    rng, g = rng_for(seed, name), Graph(name)
    d, h, n = 64, 48, 32
    x = g.input("X", ["batch", "seq", d])
    first = g.node("Slice", [g.node("Shape", [x])], starts=[0], ends=[1], axes=[0])
    rows = d if name == "reshape_opset9" else d // 2
    rest = g.node("Constant", [], value=numpy_helper.from_array(np.array([-1, rows], dtype=np.int64), "rest"))
    r = g.node("Reshape", [x, g.node("Concat", [first, rest], axis=0)])
    t = g.node("MatMul", [r, g.init("W1", dense(rng, d, h))])
    t = g.node("Add", [t, g.init("b1", vec(rng, h))])
    t = g.node("Relu", [t])
    g.node("MatMul", [t, g.init("W2", dense(rng, h, n))], ["Y"])
    g.output("Y", ["batch", "seq", n])
    g.opset = 9
    return g


def build_constant_weights(seed):
    # Weights and bias as Constant nodes' values, not initializers (torch.onnx and tf2onnx write
    # some models so).
    rng, g = rng_for(seed, "constant_weights"), Graph("constant_weights")
    d, n = 32, 24
    x = g.input("X", ["batch", "seq", d])
    w = g.node("Constant", [], value=numpy_helper.from_array(dense(rng, d, n), "W"))
    b = g.node("Constant", [], value=numpy_helper.from_array(vec(rng, n), "b"))
    t = g.node("Add", [g.node("MatMul", [x, w]), b])
    g.node("Relu", [t], ["Y"])
    g.output("Y", ["batch", "seq", n])
    return g


def build_if_branches(seed):
    # Two If nodes on opposite conditions, so that one run takes a then- and an else-branch; each
    # branch holds a MatMul: then-branches with the weight as the branch's own initializer,
    # else-branches with the outer graph's (an outer-scope value).
    rng, g = rng_for(seed, "if_branches"), Graph("if_branches")
    d, n = 32, 16
    x = g.input("X", ["batch", "seq", d])
    total = g.node("ReduceSum", [x], keepdims=0)
    cond = g.node("Greater", [total, g.init("zero", np.array(0.0, dtype=np.float32))])
    for i, c in enumerate([cond, g.node("Not", [cond])]):
        then_g, else_g = Graph(f"then{i}"), Graph(f"else{i}")
        t = then_g.node("MatMul", [x, then_g.init(f"Wt{i}", dense(rng, d, n))])
        then_g.node("Add", [t, then_g.init(f"bt{i}", vec(rng, n))], [f"yt{i}"])
        then_g.outputs.append(helper.make_tensor_value_info(f"yt{i}", TensorProto.FLOAT, None))
        t = else_g.node("MatMul", [x, g.init(f"We{i}", dense(rng, d, n))])
        else_g.node("Relu", [t], [f"ye{i}"])
        else_g.outputs.append(helper.make_tensor_value_info(f"ye{i}", TensorProto.FLOAT, None))
        out = "Y" if i == 0 else "Y2"
        g.node("If", [c], [out], then_branch=then_g.graph(), else_branch=else_g.graph())
        g.output(out, ["batch", "seq", n])
    return g


def build_loop_body(seed):
    # A Loop of 3 iterations whose body applies a layer (MatMul, bias Add, Relu) to the value it
    # carries: the body's weight is its own initializer, its bias the outer graph's.
    rng, g = rng_for(seed, "loop_body"), Graph("loop_body")
    d = 24
    x = g.input("X", ["batch", "seq", d])
    body = Graph("body")
    body.inputs.append(helper.make_tensor_value_info("i", TensorProto.INT64, []))
    body.inputs.append(helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []))
    body.inputs.append(helper.make_tensor_value_info("v", TensorProto.FLOAT, None))
    t = body.node("MatMul", ["v", body.init("Wl", (dense(rng, d, d) * 0.5).astype(np.float32))])
    t = body.node("Add", [t, g.init("bl", vec(rng, d))])
    body.node("Relu", [t], ["v_out"])
    body.node("Identity", ["cond_in"], ["cond_out"])
    body.outputs.append(helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []))
    body.outputs.append(helper.make_tensor_value_info("v_out", TensorProto.FLOAT, None))
    trips = g.init("trips", np.array(3, dtype=np.int64))
    cond = g.init("cond", np.array(True))
    g.node("Loop", [trips, cond, x], ["Y"], body=body.graph())
    g.output("Y", ["batch", "seq", d])
    return g


def build_scan_body(seed):
    # A Scan over the sequence axis whose body applies a layer (MatMul, bias Add, Relu) to each
    # step's [batch, d] slice: ORT asks the provider about the body as about an If branch.
    rng, g = rng_for(seed, "scan_body"), Graph("scan_body")
    d, h = 24, 40
    x = g.input("X", ["batch", "seq", d])
    body = Graph("body")
    body.inputs.append(helper.make_tensor_value_info("x_t", TensorProto.FLOAT, None))
    t = body.node("MatMul", ["x_t", body.init("Ws", dense(rng, d, h))])
    t = body.node("Add", [t, g.init("bs", vec(rng, h))])
    body.node("Relu", [t], ["y_t"])
    body.outputs.append(helper.make_tensor_value_info("y_t", TensorProto.FLOAT, None))
    g.node("Scan", [x], ["Y"], body=body.graph(), num_scan_inputs=1, scan_input_axes=[1], scan_output_axes=[1])
    g.output("Y", ["batch", "seq", h])
    return g


def conv_w(rng, m, c, *k):
    fan_in = c * int(np.prod(k))
    return (rng.standard_normal((m, c) + tuple(k)) / math.sqrt(fan_in)).astype(np.float32)


def build_cnn(seed):
    # A small CNN with what exporters write: explicit pads and a Relu, a grouped convolution with
    # stride 2 and SAME_UPPER, a depthwise one with dilation 2 and VALID, a pointwise one, and a
    # 2 x 2 kernel with SAME_LOWER (the padding goes before).
    rng, g = rng_for(seed, "cnn"), Graph("cnn")
    x = g.input("X", ["batch", 3, 16, 16])
    t = g.node("Conv", [x, g.init("W1", conv_w(rng, 8, 3, 3, 3)), g.init("B1", vec(rng, 8))], pads=[1, 1, 1, 1])
    t = g.node("Relu", [t])
    t = g.node("Conv", [t, g.init("W2", conv_w(rng, 8, 4, 3, 3))], group=2, strides=[2, 2], auto_pad="SAME_UPPER")
    t = g.node("Conv", [t, g.init("W3", conv_w(rng, 8, 1, 3, 3)), g.init("B3", vec(rng, 8))], group=8,
               dilations=[2, 2], auto_pad="VALID")
    t = g.node("Conv", [t, g.init("W4", conv_w(rng, 6, 8, 1, 1)), g.init("B4", vec(rng, 6))])
    g.node("Conv", [t, g.init("W5", conv_w(rng, 6, 6, 2, 2))], ["Y"], auto_pad="SAME_LOWER")
    g.output("Y", ["batch", 6, 4, 4])
    return g


def build_conv1d(seed):
    # A 1-D convolution (audio models): run as a 2-D one of height 1.
    rng, g = rng_for(seed, "conv1d"), Graph("conv1d")
    x = g.input("X", ["batch", 4, 20])
    t = g.node("Conv", [x, g.init("W", conv_w(rng, 6, 4, 5)), g.init("B", vec(rng, 6))], pads=[2, 2], strides=[2])
    g.node("Relu", [t], ["Y"])
    g.output("Y", ["batch", 6, 10])
    return g


def quantize_int8(rng, k, n, per_column):
    w = dense(rng, k, n)
    scale = (np.abs(w).max(axis=0) if per_column else np.abs(w).max()) / 127.0
    q = np.clip(np.round(w / scale), -127, 127).astype(np.int8)
    return q, np.asarray(scale, dtype=np.float32)


def build_dq_mlp(seed):
    # A dynamically quantized MLP as onnxruntime's quantize_dynamic writes it for CPUs: int8
    # weights, one scale per tensor (first layer) or per column with zero points of 0 (second).
    rng, g = rng_for(seed, "dq_mlp"), Graph("dq_mlp")
    d, h = 64, 96
    x = g.input("X", ["batch", "seq", d])
    q1, s1 = quantize_int8(rng, d, h, False)
    t = g.node("DynamicQuantizeMatMul", [x, g.init("B1", q1), g.init("s1", s1), "", g.init("b1", vec(rng, h))],
               domain=MS_DOMAIN)
    t = g.node("Relu", [t])
    q2, s2 = quantize_int8(rng, h, d, True)
    t = g.node("DynamicQuantizeMatMul", [t, g.init("B2", q2), g.init("s2", s2), g.init("z2", np.zeros(d, np.int8))],
               domain=MS_DOMAIN)
    g.node("Add", [t, g.init("b2", vec(rng, d))], ["Y"])
    g.output("Y", ["batch", "seq", d])
    return g


def build_mmi_mlp(seed, name="mmi_mlp"):
    # MatMuls as onnxruntime's quantize_dynamic writes them for CPUs in its default (QOperator)
    # format: DynamicQuantizeLinear (uint8 A, one scale and zero point), MatMulInteger with int8
    # weights, Cast to float, Mul by (A's scale x the weights' scale). One DynamicQuantizeLinear
    # feeds two layers (as Q and K of an attention block); the third layer is
    # com.microsoft.MatMulIntegerToFloat, as ORT's own fusion saves it in an optimized model; the
    # fourth has asymmetric uint8 weights, which stay on the CPU provider; the fifth takes an A
    # quantized with a constant scale and zero point.
    # mmi_mlp_7bit: the int8 weights in 7 bits (seven_bit), which ORT's u8s8 kernels without VNNI
    # need: with full-range weights its CPU provider is less exact than the EP.
    rng, g = rng_for(seed, "mmi_mlp"), Graph(name)

    def int8_weights(k, n, per_column):
        q, sc = quantize_int8(rng, k, n, per_column)
        return seven_bit(q, sc) if name == "mmi_mlp_7bit" else (q, sc)
    d, h = 64, 96
    x = g.input("X", ["batch", "seq", d])
    xq = dynamic_quantize(g, x)
    q1, s1 = int8_weights(d, h, False)
    t = matmul_integer(g, xq, g.init("B1", q1), g.init("s1", s1))
    t = g.node("Relu", [g.node("Add", [t, g.init("b1", vec(rng, h))])])
    q2, s2 = int8_weights(d, h, True)
    matmul_integer(g, xq, g.init("B2", q2), g.init("s2", s2), g.init("z2", np.zeros(h, np.int8)), "Y2")
    tq = dynamic_quantize(g, t)
    q3, s3 = int8_weights(h, d, True)
    t = g.node("MatMulIntegerToFloat", [tq[0], g.init("B3", q3), tq[1], g.init("s3", s3), tq[2], "",
                                        g.init("b3", vec(rng, d))], domain=MS_DOMAIN)
    uq = dynamic_quantize(g, t)
    w4 = dense(rng, d, d)
    lo, hi = float(w4.min()), float(w4.max())
    s4 = np.float32((hi - lo) / 255.0)
    z4 = np.uint8(np.clip(np.round(-lo / s4), 0, 255))
    q4 = np.clip(np.round(w4 / s4) + z4, 0, 255).astype(np.uint8)
    matmul_integer(g, uq, g.init("B4", q4), g.init("s4", np.asarray(s4, np.float32)),
                   g.init("z4", np.asarray(z4, np.uint8)), "Y")
    # Static quantization: A quantized by QuantizeLinear with a constant scale and zero point; ORT
    # folds the Mul of the two constant scales into one before any provider sees the graph.
    a5 = np.float32(2.0 / 255.0)
    xq5 = g.node("QuantizeLinear", [x, g.init("a5_scale", np.asarray(a5, np.float32)),
                                    g.init("a5_zero", np.asarray(128, np.uint8))])
    q5, s5 = int8_weights(d, h, True)
    matmul_integer(g, [xq5, "a5_scale", "a5_zero"], g.init("B5", q5), g.init("s5", s5), out="Y3")
    g.output("Y", ["batch", "seq", d])
    g.output("Y2", ["batch", "seq", h])
    g.output("Y3", ["batch", "seq", h])
    return g


def build_mmi_negative_scale(seed):
    # A MatMulInteger layer whose weights have a negative column scale (legal ONNX; XNNPACK's 4-bit
    # path refuses such scales, its int8 path takes them). 7-bit weights, so that ORT's own
    # kernels do not saturate.
    rng, g = rng_for(seed, "mmi_negative_scale"), Graph("mmi_negative_scale")
    d, h = 32, 48
    x = g.input("X", ["batch", "seq", d])
    xq = dynamic_quantize(g, x)
    q, sc = seven_bit(*quantize_int8(rng, d, h, True))
    sc[3] = -sc[3]
    matmul_integer(g, xq, g.init("B", q), g.init("s", sc), out="Y")
    g.output("Y", ["batch", "seq", h])
    return g


def build_nonfinite(seed):
    # NaN as a model that broke upstream makes it (Sqrt of the negative half of the inputs), and
    # NaN or infinite constants: every output ONNX makes NaN must stay NaN (XNNPACK's quantized
    # kernels clamp a NaN to -inf, and a Relu fused as the clamp made it 0), layers with
    # non-finite constants stay on the CPU provider, and so does a layer whose A is a constant.
    # Found by a hostile review.
    rng, g = rng_for(seed, "nonfinite"), Graph("nonfinite")
    d, h = 64, 32
    x = g.input("X", ["batch", "seq", d])
    r = g.node("Sqrt", [x])  # NaN where X < 0
    # f32 MatMul + Relu on a NaN row (taken).
    g.node("Relu", [g.node("MatMul", [r, g.init("W1", dense(rng, d, h))])], ["Y1"])
    # DynamicQuantizeMatMul on a NaN row (taken): ORT quantizes A as one tensor.
    q2, s2 = quantize_int8(rng, d, h, True)
    g.node("DynamicQuantizeMatMul", [r, g.init("B2", q2), g.init("s2", s2)], ["Y2"], domain=MS_DOMAIN)
    # MatMulNBits on a NaN row (taken).
    b3, s3 = quantize_blocks(rng, d, h, 32)
    g.node("MatMulNBits", [r, g.init("B3", b3), g.init("s3", s3)], ["Y3"], domain=MS_DOMAIN, K=d, N=h, bits=4,
           block_size=32, accuracy_level=0)
    # MatMulInteger whose A scale is NaN at run time (taken): NaN everywhere.
    xq = dynamic_quantize(g, x)
    nan_scale = g.node("Mul", [xq[1], g.init("nan", np.asarray(np.nan, np.float32))])
    q4, s4 = quantize_int8(rng, d, h, True)
    g.node("Relu", [matmul_integer(g, [xq[0], nan_scale, xq[2]], g.init("B4", q4), g.init("s4", s4))], ["Y4"])
    # MatMulInteger with a NaN column scale (left).
    s5 = s4.copy()
    s5[2] = np.nan
    matmul_integer(g, xq, g.init("B5", q4), g.init("s5", s5), out="Y5")
    # DynamicQuantizeMatMul with an infinite bias (left).
    b6 = vec(rng, h)
    b6[1] = np.inf
    g.node("DynamicQuantizeMatMul", [x, g.init("B6", q2), g.init("s6", s2), "", g.init("b6", b6)], ["Y6"],
           domain=MS_DOMAIN)
    # MatMulIntegerToFloat with a constant A (left).
    a7 = np.asarray(rng.integers(0, 256, size=(3, d)), np.uint8)
    g.node("MatMulIntegerToFloat", [g.init("A7", a7), g.init("B7", q4), g.init("a7s", np.asarray(0.01, np.float32)),
                                    g.init("s7", s4)], ["Y7"], domain=MS_DOMAIN)
    for name, shape in [("Y1", h), ("Y2", h), ("Y3", h), ("Y4", h), ("Y5", h), ("Y6", h)]:
        g.output(name, ["batch", "seq", shape])
    g.output("Y7", [3, h])
    return g


def build_mmi_unsupported_run(seed, name):
    # Layers whose Run the CPU provider refuses or the provider cannot compute: a zero point of
    # shape [1, 1] (ORT's kernel wants a scalar or a 1-D tensor of one: left to it, which fails the
    # Run as it would without the provider), and an A scale whose product with the weights' leaves
    # float's normal range (taken; the Run fails with an error instead of flushing to zero).
    # quant_inf_row: a 4-bit layer on infinite activations (X / 0), whose outputs are infinities of
    # signs only the weights know: the provider's Run fails. quant_tiny_rows: a
    # DynamicQuantizeMatMul on activations of about 1e-37, which XNNPACK's quantization cannot scale.
    rng, g = rng_for(seed, name), Graph(name)
    d, h = 32, 16
    x = g.input("X", ["batch", "seq", d])
    if name == "quant_inf_row":
        b, sc4 = quantize_blocks(rng, d, h, 32)
        inf = g.node("Div", [x, g.init("zeros", np.zeros(d, np.float32))])
        g.node("MatMulNBits", [inf, g.init("B", b), g.init("s", sc4)], ["Y"], domain=MS_DOMAIN, K=d, N=h, bits=4,
               block_size=32, accuracy_level=0)
        g.output("Y", ["batch", "seq", h])
        return g
    q, sc = quantize_int8(rng, d, h, True)
    if name == "quant_tiny_rows":
        tiny = g.node("Mul", [x, g.init("tiny", np.asarray(1e-37, np.float32))])
        g.node("DynamicQuantizeMatMul", [tiny, g.init("B", q), g.init("s", sc)], ["Y"], domain=MS_DOMAIN)
        g.output("Y", ["batch", "seq", h])
        return g
    xq = dynamic_quantize(g, x)
    if name == "mmi_zero_1x1":
        # And a DynamicQuantizeMatMul whose b_zero_point is [1, 1], which ORT's kernel refuses too.
        g.node("DynamicQuantizeMatMul", [x, g.init("B0", q), g.init("s0", sc), g.init("z0", np.zeros((1, 1), np.int8))],
               ["Y0"], domain=MS_DOMAIN)
        g.output("Y0", ["batch", "seq", h])
        zero = g.node("Reshape", [xq[2], g.init("shape11", np.asarray([1, 1], np.int64))])
        matmul_integer(g, [xq[0], xq[1], zero], g.init("B", q), g.init("s", sc), out="Y")
    else:
        tiny = g.node("Mul", [xq[1], g.init("tiny", np.asarray(1e-30, np.float32))])
        matmul_integer(g, [xq[0], tiny, xq[2]], g.init("B", q), g.init("s", (sc * 1e-8).astype(np.float32)), out="Y")
    g.output("Y", ["batch", "seq", h])
    return g


def build_gemm_unknown_rank_1d(seed):
    # A computed Reshape at opset 9 (rank unknown to ORT) that flattens to 1-D before a Gemm: ONNX
    # wants A 2-D, ORT's CPU provider runs it as one row, [1, N] (a hostile review's finding).
    rng, g = rng_for(seed, "gemm_unknown_rank_1d"), Graph("gemm_unknown_rank_1d")
    x = g.input("X", ["batch", "seq", 6])
    first = g.node("Slice", [g.node("Shape", [x])], starts=[0], ends=[1], axes=[0])
    rest = g.node("Constant", [], value=numpy_helper.from_array(np.array([36], dtype=np.int64), "rest"))
    shape = g.node("Slice", [g.node("Concat", [first, rest], axis=0)], starts=[1], ends=[100], axes=[0])
    flat = g.node("Reshape", [x, shape])
    g.node("Gemm", [flat, g.init("B", dense(rng, 36, 5)), g.init("C", vec(rng, 5))], ["Y"])
    g.output("Y", [1, 5])
    g.opset = 9
    return g


def build_conv_add_bias(seed):
    # A convolution without a bias followed by an Add of one value per channel ([M, 1, 1]) and a
    # Relu: both fused. One with its own bias, then an Add of [1, M, 1, 1]: the Add stays apart.
    rng, g = rng_for(seed, "conv_add_bias"), Graph("conv_add_bias")
    x = g.input("X", ["batch", 3, 8, 8])
    t = g.node("Conv", [x, g.init("W1", conv_w(rng, 4, 3, 3, 3))], pads=[1, 1, 1, 1])
    t = g.node("Add", [t, g.init("c1", vec(rng, 4).reshape(4, 1, 1))])
    t = g.node("Relu", [t])
    t = g.node("Conv", [t, g.init("W2", conv_w(rng, 4, 4, 1, 1)), g.init("B2", vec(rng, 4))])
    g.node("Add", [t, g.init("c2", vec(rng, 4).reshape(1, 4, 1, 1))], ["Y"])
    g.output("Y", ["batch", 4, 8, 8])
    return g


def build_conv_empty_width(seed):
    # A convolution of an input of width 0 whose pads still give it an output: every value is the
    # bias (a hostile review's finding).
    rng, g = rng_for(seed, "conv_empty_width"), Graph("conv_empty_width")
    x = g.input("X", [2, 3, 6, 6])
    empty = g.node("Slice", [x, g.init("s0", np.array([0], np.int64)), g.init("e0", np.array([0], np.int64)),
                             g.init("ax", np.array([3], np.int64))])
    t = g.node("Conv", [empty, g.init("W", conv_w(rng, 4, 3, 1, 1)), g.init("B", vec(rng, 4))], pads=[0, 1, 0, 1])
    g.node("Relu", [t], ["Y"])
    g.output("Y", [2, 4, 6, 2])
    return g


def build_vector_input(seed):
    # A 1-D A ([K]): MatMul's output is then [N] (ONNX promotes A to [1, K] and drops the 1).
    rng, g = rng_for(seed, "vector_input"), Graph("vector_input")
    k, n = 24, 10
    x = g.input("X", [k])
    t = g.node("MatMul", [x, g.init("W", dense(rng, k, n))])
    g.node("Add", [t, g.init("b", vec(rng, n))], ["Y"])
    g.output("Y", [n])
    return g


def build_quant_rows(seed):
    # Rows the quantized kernels must get exactly (a hostile review's findings): a row of zeros
    # through MatMulNBits and DynamicQuantizeMatMul gives exactly 0 or the bias, as in ONNX
    # (XNNPACK's 4-bit kernel was off, up to 0.03 at K = 16384); and a 1-D A with b_scale [1, N]
    # (taken: its shape is B's business).
    rng, g = rng_for(seed, "quant_rows"), Graph("quant_rows")
    d, h = 64, 48
    # Six positions: mixed values, zeros, one nonzero value, a constant, all negative, a negative
    # constant (the rows of XNNPACK's tiles then hold such rows side by side).
    x = g.input("X", ["batch", 6, d])
    mask = np.zeros((1, 6, d), np.float32)
    add = np.zeros((1, 6, d), np.float32)
    mask[0, 0] = 1
    mask[0, 2, d // 3] = 1
    add[0, 3] = 0.37
    mask[0, 4] = -1
    add[0, 5] = -0.81
    t = g.node("Add", [g.node("Mul", [g.node("Abs", [x]), g.init("mask", mask)]), g.init("add", add)])
    # 4-bit values over their whole range 0..15 (-8..7 about the zero point 8), as real exports
    # have them, and block scales of 1e-3 to 1e-1: the zero row's error showed with these.
    q4 = rng.integers(0, 16, size=(h, d // 32, 32), dtype=np.uint8)
    b = (q4[:, :, 0::2] | (q4[:, :, 1::2] << 4)).astype(np.uint8)
    sc = np.exp(rng.uniform(math.log(1e-3), math.log(1e-1), size=h * (d // 32))).astype(np.float32)
    g.node("MatMulNBits", [t, g.init("B1", b), g.init("s1", sc)], ["Y1"],
           domain=MS_DOMAIN, K=d, N=h, bits=4, block_size=32, accuracy_level=0)

    q, s2 = seven_bit(*quantize_int8(rng, d, h, True))
    g.node("DynamicQuantizeMatMul", [t, g.init("B2", q), g.init("s2", s2), "", g.init("b2", vec(rng, h))], ["Y2"],
           domain=MS_DOMAIN)
    v = g.input("V", [d])
    q3, s3 = seven_bit(*quantize_int8(rng, d, h, True))
    g.node("DynamicQuantizeMatMul", [v, g.init("B3", q3), g.init("s3", s3.reshape(1, h))], ["Y3"], domain=MS_DOMAIN)
    g.output("Y1", ["batch", 6, h])
    g.output("Y2", ["batch", 6, h])
    g.output("Y3", [h])
    return g


def build_declined(seed):
    # Weight-bearing nodes the provider leaves to ONNX Runtime's CPU provider (a Gemm with A
    # transposed, a MatMul with a batched 3-D constant B) beside one it takes: its verbose log says
    # why for each, and its stats count all three as seen and one as taken.
    rng, g = rng_for(seed, "declined"), Graph("declined")
    k, n, n2 = 16, 8, 5
    a = g.input("A", [k, "rows"])
    t = g.node("Gemm", [a, g.init("B", dense(rng, k, n))], transA=1)
    g.node("MatMul", [t, g.init("W", dense(rng, n, n2))], ["Y"])
    g.output("Y", ["rows", n2])
    x = g.input("X", [2, 3, n])
    g.node("MatMul", [x, g.init("W3", dense(rng, 2 * n, n2).reshape(2, n, n2))], ["Y3"])
    g.output("Y3", [2, 3, n2])
    return g


def build_big(seed, name, dim, hidden, layers, stream):
    """`layers` transformer MLP blocks (MatMul + Add + Gelu + MatMul + Add), f32 or 4-bit: the
    benchmark models. Weights go straight to the external data file (`stream`), never held all at
    once: 704 MiB as numpy arrays and again as protobuf bytes would need twice that."""
    if name == "big_resnet":
        return build_resnet50(seed, stream)
    rng, g = rng_for(seed, name), Graph(name)
    x = g.input("X", ["batch", "seq", dim])
    for layer in range(layers):
        if name == "big_dq":  # dynamically quantized int8 (onnxruntime's quantize_dynamic), per-column scales
            for half, (k, n) in enumerate([(dim, hidden), (hidden, dim)]):
                q, sc = quantize_int8(rng, k, n, True)
                x = g.node("DynamicQuantizeMatMul", [x, stream(g, f"l{layer}.W{half + 1}_q8", q),
                                                     stream(g, f"l{layer}.W{half + 1}_scales", sc), "",
                                                     stream(g, f"l{layer}.b{half + 1}", vec(rng, n))],
                           ["Y"] if layer == layers - 1 and half == 1 else None, domain=MS_DOMAIN)
                if half == 0:
                    x = g.node("Gelu", [x], domain=MS_DOMAIN)
            continue
        if name == "big_mmi":  # quantize_dynamic's default (QOperator): DynamicQuantizeLinear, MatMulInteger...
            for half, (k, n) in enumerate([(dim, hidden), (hidden, dim)]):
                q, sc = quantize_int8(rng, k, n, True)
                t = matmul_integer(g, dynamic_quantize(g, x), stream(g, f"l{layer}.W{half + 1}_q8", q),
                                   stream(g, f"l{layer}.W{half + 1}_scales", sc))
                last = layer == layers - 1 and half == 1
                x = g.node("Add", [t, stream(g, f"l{layer}.b{half + 1}", vec(rng, n))], ["Y"] if last else None)
                if half == 0:
                    x = g.node("Gelu", [x], domain=MS_DOMAIN)
            continue
        if name == "big_mlp":
            t = g.node("MatMul", [x, stream(g, f"l{layer}.W1", dense(rng, dim, hidden))])
        else:
            b, s = quantize_blocks(rng, dim, hidden, 32)
            t = matmul_nbits(g, x, stream(g, f"l{layer}.W1_q4", b), stream(g, f"l{layer}.W1_scales", s), dim, hidden)
        t = g.node("Add", [t, stream(g, f"l{layer}.b1", vec(rng, hidden))])
        t = g.node("Gelu", [t], domain=MS_DOMAIN)
        if name == "big_mlp":
            t = g.node("MatMul", [t, stream(g, f"l{layer}.W2", dense(rng, hidden, dim))])
        else:
            b, s = quantize_blocks(rng, hidden, dim, 32)
            t = matmul_nbits(g, t, stream(g, f"l{layer}.W2_q4", b), stream(g, f"l{layer}.W2_scales", s), hidden, dim)
        x = g.node("Add", [t, stream(g, f"l{layer}.b2", vec(rng, dim))], ["Y"] if layer == layers - 1 else None)
    g.output("Y", ["batch", "seq", dim])
    return g


def build_resnet50(seed, stream):
    """A ResNet-50-shaped f32 CNN (the benchmark's convolution model): a 7x7 stem, bottleneck
    stages of 3, 4, 6 and 3 blocks (widths 256 to 2048, a 1x1 projection on each stage's first
    block), global average pooling and a 1000-way Gemm; batch norms folded into conv biases, as
    exported models have them after optimization. 25.5 M weights, 102 MB."""
    rng, g = rng_for(seed, "big_resnet"), Graph("big_resnet")
    count = [0]

    def conv(x, cin, cout, k, stride=1, relu=True):
        count[0] += 1
        i = count[0]
        t = g.node("Conv", [x, stream(g, f"c{i}.W", conv_w(rng, cout, cin, k, k)), stream(g, f"c{i}.B", vec(rng, cout))],
                   pads=[k // 2] * 4, strides=[stride, stride])
        return g.node("Relu", [t]) if relu else t

    x = g.input("X", ["batch", 3, 224, 224])
    t = conv(x, 3, 64, 7, 2)
    t = g.node("MaxPool", [t], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    cin = 64
    for stage, (mid, blocks) in enumerate([(64, 3), (128, 4), (256, 6), (512, 3)]):
        out = mid * 4
        for b in range(blocks):
            stride = 2 if b == 0 and stage > 0 else 1
            y = conv(t, cin, mid, 1)
            y = conv(y, mid, mid, 3, stride)
            y = conv(y, mid, out, 1, relu=False)
            short = conv(t, cin, out, 1, stride, relu=False) if b == 0 else t
            t = g.node("Relu", [g.node("Add", [y, short])])
            cin = out
    t = g.node("Flatten", [g.node("GlobalAveragePool", [t])])
    g.node("Gemm", [t, stream(g, "fc.W", dense(rng, 2048, 1000)), stream(g, "fc.B", vec(rng, 1000))], ["Y"])
    g.output("Y", ["batch", 1000])
    return g


# ---------------------------------------------------------------------------------------------
# Writing
# ---------------------------------------------------------------------------------------------

def save_both(model, out, name, ext):
    onnx.save(model, os.path.join(out, f"{name}.onnx"))
    files = [f"{name}.onnx"]
    if ext:
        # onnx.save moves the tensors' bytes to the data file in place: work on a copy.
        m = onnx.ModelProto()
        m.CopyFrom(model)
        data = f"{name}.ext.onnx.data"
        if os.path.exists(os.path.join(out, data)):
            os.remove(os.path.join(out, data))  # onnx 1.12 appends to an existing data file
        onnx.save(m, os.path.join(out, f"{name}.ext.onnx"), save_as_external_data=True,
                  all_tensors_to_one_file=True, location=data, size_threshold=0)
        files.append(f"{name}.ext.onnx")
    return files


def write_big(out, name, seed, dim, hidden, layers):
    model_file, data = f"{name}.ext.onnx", f"{name}.ext.onnx.data"
    data_path = os.path.join(out, data)
    with open(data_path + ".tmp", "wb") as f:
        def stream(g, tensor_name, array):
            # Each tensor at a 4 KiB-aligned offset: a page boundary, as a provider reading the
            # mapped file would want (onnx.save packs them back to back).
            pad = (-f.tell()) % 4096
            f.write(b"\0" * pad)
            offset = f.tell()
            f.write(np.ascontiguousarray(array).tobytes())
            t = TensorProto()
            t.name = tensor_name
            t.data_type = onnx.mapping.NP_TYPE_TO_TENSOR_TYPE[array.dtype]
            t.dims.extend(array.shape)
            t.data_location = TensorProto.EXTERNAL
            for key, value in (("location", data), ("offset", str(offset)), ("length", str(array.nbytes))):
                entry = t.external_data.add()
                entry.key, entry.value = key, value
            g.inits.append(t)
            return tensor_name
        g = build_big(seed, name, dim, hidden, layers, stream)
    os.replace(data_path + ".tmp", data_path)
    onnx.save(g.model(), os.path.join(out, model_file))
    return g, [model_file]


def shape_for_tests(value_info, batch, seq):
    dims = []
    for d in value_info.type.tensor_type.shape.dim:
        if d.HasField("dim_value"):
            dims.append(d.dim_value)
        else:
            dims.append({"batch": batch, "seq": seq}.get(d.dim_param, batch * seq))
    return dims


def manifest_entry(g, files):
    def io(v):
        return {"name": v.name, "shape": shape_for_tests(v, DEFAULT_BATCH, DEFAULT_SEQ),
                "symbolic_shape": [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim],
                "dtype": onnx.mapping.TENSOR_TYPE_TO_NP_TYPE[v.type.tensor_type.elem_type].name}
    ops = sorted({(n.domain + "." if n.domain else "") + n.op_type for n in g.nodes})
    return {"files": files, "inputs": [io(v) for v in g.inputs], "outputs": [v.name for v in g.outputs],
            "output_shapes": [shape_for_tests(v, DEFAULT_BATCH, DEFAULT_SEQ) for v in g.outputs], "ops": ops}


def generate(args):
    os.makedirs(args.out, exist_ok=True)
    names = args.only or (BIG_MODELS if args.big else MODELS)
    manifest_path = os.path.join(args.out, "manifest.json")
    manifest = {"seed": args.seed, "batch": DEFAULT_BATCH, "seq": DEFAULT_SEQ, "models": {}}
    if os.path.exists(manifest_path):  # --only adds to what an earlier run wrote
        with open(manifest_path) as f:
            manifest["models"] = json.load(f).get("models", {})
    builders = {"mlp": build_mlp, "shared_weight": build_shared_weight, "matmul_input_b": build_matmul_input_b,
                "odd_shapes": build_odd_shapes, "matmulnbits": build_matmulnbits,
                "gemm": build_gemm, "gemm_nobias": lambda s: build_gemm(s, "gemm_nobias"),
                "gemm_relu": lambda s: build_gemm(s, "gemm_relu"), "bias_rank3": build_bias_rank3,
                "gemm_tiny_alpha": build_gemm_tiny_alpha, "nbits_negative_scale": build_nbits_negative_scale,
                "reshape_opset9": build_reshape_opset9,
                "reshape_opset9_bad_k": lambda s: build_reshape_opset9(s, "reshape_opset9_bad_k"),
                "constant_weights": build_constant_weights, "if_branches": build_if_branches,
                "declined": build_declined, "vector_input": build_vector_input,
                "loop_body": build_loop_body, "cnn": build_cnn, "conv1d": build_conv1d,
                "dq_mlp": build_dq_mlp, "gemm_unknown_rank_1d": build_gemm_unknown_rank_1d,
                "conv_empty_width": build_conv_empty_width, "conv_add_bias": build_conv_add_bias,
                "mmi_mlp": build_mmi_mlp, "mmi_mlp_7bit": lambda s: build_mmi_mlp(s, "mmi_mlp_7bit"),
                "mmi_negative_scale": build_mmi_negative_scale, "nonfinite": build_nonfinite,
                "scan_body": build_scan_body,
                "mmi_zero_1x1": lambda s: build_mmi_unsupported_run(s, "mmi_zero_1x1"),
                "mmi_scale_underflow": lambda s: build_mmi_unsupported_run(s, "mmi_scale_underflow"),
                "quant_inf_row": lambda s: build_mmi_unsupported_run(s, "quant_inf_row"),
                "quant_tiny_rows": lambda s: build_mmi_unsupported_run(s, "quant_tiny_rows"),
                "quant_rows": build_quant_rows}
    for name in names:
        if name in BIG_MODELS + EXTRA_BIG_MODELS:
            if not args.big:
                sys.exit(f"make_models.py: {name} needs --big")
            g, files = write_big(args.out, name, args.seed, args.dim, args.hidden, args.layers)
        elif name in builders:
            g = builders[name](args.seed)
            model = g.model(getattr(g, "opset", OPSET))
            onnx.checker.check_model(model)
            files = save_both(model, args.out, name, ext=name in ("mlp", "matmulnbits"))
        else:
            sys.exit(f"make_models.py: unknown model {name} (known: {' '.join(MODELS + BIG_MODELS + EXTRA_BIG_MODELS)})")
        manifest["models"][name] = manifest_entry(g, files)
        print(f"{name}: {' '.join(files)}", file=sys.stderr)
    with open(manifest_path, "w") as f:
        json.dump(manifest, f, indent=1)
    print(json.dumps(manifest))


# ---------------------------------------------------------------------------------------------
# --check: the float64 reference
# ---------------------------------------------------------------------------------------------

M64 = (1 << 64) - 1


def input_values(index, count, seed):
    """What weightcache-ort-host feeds input number `index`: see the module docstring."""
    with np.errstate(over="ignore"):
        base = np.uint64((seed ^ (((index + 1) * 0xD1B54A32D192ED03) & M64)) & M64)
        z = base + (np.arange(1, count + 1, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15))
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    return ((z >> np.uint64(40)).astype(np.float64) / float(1 << 24) * 2.0 - 1.0).astype(np.float32)


def erf(x):
    v = np.vectorize(math.erf, otypes=[np.float64])
    return v(x)


def evaluate(model, feeds):
    """The model's outputs in float64: the ops these models use, nothing else."""
    env = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    env = {k: (v.astype(np.float64) if v.dtype == np.float32 else v) for k, v in env.items()}
    env.update({k: v.astype(np.float64) for k, v in feeds.items()})
    for n in model.graph.node:
        a = {x.name: helper.get_attribute_value(x) for x in n.attribute}
        i = [env[x] for x in n.input if x]
        if n.op_type == "MatMul":
            r = np.matmul(i[0], i[1])
        elif n.op_type == "Add":
            r = i[0] + i[1]
        elif n.op_type == "Relu":
            r = np.maximum(i[0], 0.0)
        elif n.op_type == "Gelu":
            r = 0.5 * i[0] * (1.0 + erf(i[0] / math.sqrt(2.0)))
        elif n.op_type == "Gemm":
            A = i[0].T if a.get("transA", 0) else i[0]
            B = i[1].T if a.get("transB", 0) else i[1]
            r = a.get("alpha", 1.0) * (A @ B)
            if len(i) > 2:
                r = r + a.get("beta", 1.0) * i[2]
        elif n.op_type == "DynamicQuantizeMatMul":
            # The ideal the quantized product approximates: A unquantized, B dequantized exactly.
            names = list(n.input)
            b = env[names[1]].astype(np.float64)
            if len(names) > 3 and names[3]:
                b = b - env[names[3]].astype(np.float64)
            r = np.matmul(i[0], b * env[names[2]].astype(np.float64))
            if len(names) > 4 and names[4]:
                r = r + env[names[4]]
        elif n.op_type == "DynamicQuantizeLinear":
            # ONNX's definition: uint8, a range that includes 0, zero point rounded half to even.
            x = i[0].astype(np.float32)
            lo, hi = min(0.0, float(x.min())), max(0.0, float(x.max()))
            scale = np.float32((hi - lo) / 255.0) if hi > lo else np.float32(1.0)
            zero = np.clip(np.rint(np.float32(0.0) - np.float32(lo) / scale), 0, 255)
            q = np.clip(np.rint(x / scale) + zero, 0, 255)
            for name, v in zip(n.output, [q.astype(np.uint8), np.float64(scale), np.uint8(zero)]):
                env[name] = v
            continue
        elif n.op_type in ("MatMulInteger", "MatMulIntegerToFloat"):
            names = list(n.input)
            a = env[names[0]].astype(np.int64)
            b = env[names[1]].astype(np.int64)
            az, bz = (2, 3) if n.op_type == "MatMulInteger" else (4, 5)
            if len(names) > az and names[az]:
                a = a - env[names[az]].astype(np.int64)
            if len(names) > bz and names[bz]:
                b = b - env[names[bz]].astype(np.int64)
            r = np.matmul(a, b)
            if n.op_type == "MatMulIntegerToFloat":
                r = r.astype(np.float64) * (env[names[2]] * env[names[3]].astype(np.float64))
                if len(names) > 6 and names[6]:
                    r = r + env[names[6]]
        elif n.op_type == "QuantizeLinear":
            x = i[0].astype(np.float32)
            r = np.clip(np.rint(x / np.float32(i[1])) + i[2].astype(np.float64), 0, 255).astype(np.uint8)
        elif n.op_type == "Cast":
            r = i[0].astype(np.float64)
        elif n.op_type == "Mul":
            r = i[0] * i[1]
        elif n.op_type == "Abs":
            r = np.abs(i[0])
        elif n.op_type == "MatMulNBits":
            assert a["bits"] == 4 and len(i) == 3, "only 4-bit without zero points"
            w = dequantize_nbits(i[1], i[2].astype(np.float32), a["K"], a["N"], a["block_size"])
            r = np.matmul(i[0], w)
        else:
            raise SystemExit(f"make_models.py --check: no reference for {n.op_type}")
        env[n.output[0]] = r
    return [env[o.name] for o in model.graph.output]


def check(args):
    path = os.path.join(args.check, f"{args.model}.onnx")
    if not os.path.exists(path):
        path = os.path.join(args.check, f"{args.model}.ext.onnx")
    model = onnx.load(path)  # loads external data too
    inits = {t.name for t in model.graph.initializer}
    feeds = {}
    for index, v in enumerate(x for x in model.graph.input if x.name not in inits):
        shape = shape_for_tests(v, args.batch, args.seq)
        feeds[v.name] = input_values(index, int(np.prod(shape)), args.input_seed).reshape(shape)
    refs = evaluate(model, feeds)
    got = np.fromfile(args.outputs, dtype=np.float32)
    want = sum(r.size for r in refs)
    if got.size != want:
        print(f"{args.model}: {args.outputs} holds {got.size} floats, the reference {want}", file=sys.stderr)
        return 3
    ref = np.concatenate([r.ravel() for r in refs])
    err = np.abs(got.astype(np.float64) - ref)
    rel = err / np.maximum(np.abs(ref), 1e-30)
    bad = int(np.count_nonzero(err > args.atol + args.rtol * np.abs(ref)))
    result = {"model": args.model, "elements": int(ref.size), "max_abs": float(err.max()),
              "rms_abs": float(np.sqrt(np.mean(err * err))),
              "max_rel": float(rel[np.abs(ref) > args.atol].max(initial=0.0)), "max_ref": float(np.abs(ref).max()),
              "out_of_tolerance": bad, "rtol": args.rtol, "atol": args.atol}
    print(json.dumps(result))
    if args.write_ref:
        ref.astype(np.float32).tofile(args.write_ref)
    return 3 if bad else 0


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", help="directory to write the models and manifest.json into")
    p.add_argument("--seed", type=int, default=1, help="weights' seed (default 1)")
    p.add_argument("--only", nargs="+", metavar="NAME", help="these models only")
    p.add_argument("--big", action="store_true", help="the benchmark models (big_mlp, big_nbits) instead")
    p.add_argument("--dim", type=int, default=2048, help="--big: model width D (default 2048)")
    p.add_argument("--hidden", type=int, default=5632, help="--big: MLP width H (default 5632)")
    p.add_argument("--layers", type=int, default=8, help="--big: MLP blocks (default 8)")
    p.add_argument("--check", metavar="DIR", help="compare weightcache-ort-host --out with numpy for a model in DIR")
    p.add_argument("--model", help="--check: the model's name (NAME.onnx, else NAME.ext.onnx)")
    p.add_argument("--outputs", help="--check: the host's --out file")
    p.add_argument("--write-ref", help="--check: also write the reference, as float32, to this file")
    p.add_argument("--batch", type=int, default=DEFAULT_BATCH)
    p.add_argument("--seq", type=int, default=DEFAULT_SEQ)
    p.add_argument("--input-seed", type=int, default=1, help="--check: the host's --seed (default 1)")
    p.add_argument("--rtol", type=float, default=1e-4)
    p.add_argument("--atol", type=float, default=1e-5)
    args = p.parse_args()
    if args.check:
        if not args.model or not args.outputs:
            p.error("--check needs --model and --outputs")
        return check(args)
    if not args.out:
        p.error("--out DIR (or --check DIR)")
    if args.big and (args.dim % 32 or args.hidden % 32):
        p.error("--dim and --hidden must be multiples of 32 (MatMulNBits' block)")
    generate(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
