"""Networks: MLPs, ensembles of MLPs evaluated as one batched matmul, policy heads and value nets.

- :mod:`phalanx.nets.mlp`: :func:`mlp`, :class:`EnsembleLinear` and :class:`EnsembleMLP`, and the
  initialisation they share;
- :mod:`phalanx.nets.heads`: the policy heads (categorical, multi-categorical, Gaussian) and the value net;
- :mod:`phalanx.nets.members`: the heads of P population members as one module;
- :mod:`phalanx.nets.encoders`: the observation encoders (Nature CNN, IMPALA ResNet, Dict) and
  :func:`feature_encoder`, which picks one for a space;
- :mod:`phalanx.nets.spaces`: what the networks read of observation and action spaces.
"""

from phalanx.nets.encoders import (
    DictEncoder,
    ImageEncoder,
    ImpalaCNN,
    NatureCNN,
    conv_init,
    feature_encoder,
)
from phalanx.nets.heads import (
    LOG_SQRT_2PI,
    ActionNoise,
    CategoricalPolicy,
    GaussianPolicy,
    MultiCategoricalPolicy,
    ValueNet,
    encoder_observation_rank,
    head_encoder,
    head_mlp,
    head_on_features,
    log_softmax_actions_first,
)
from phalanx.nets.members import (
    MemberActor,
    MemberCategoricalPolicy,
    MemberGaussianPolicy,
    MemberNoise,
    MemberValueNet,
)
from phalanx.nets.mlp import (
    ACTIVATIONS,
    HIDDEN_GAIN,
    MLP,
    POLICY_OUTPUT_GAIN,
    VALUE_OUTPUT_GAIN,
    EnsembleLayerNorm,
    EnsembleLinear,
    EnsembleMLP,
    Tensor,
    activation_class,
    layer_init,
    mlp,
)
from phalanx.nets.spaces import (
    SUPPORTED_SPACES,
    image_layout,
    is_image_space,
    multi_discrete_sizes,
    obs_dim,
    observation_kind,
    observation_shape,
)

__all__ = [
    "ACTIVATIONS",
    "HIDDEN_GAIN",
    "LOG_SQRT_2PI",
    "MLP",
    "POLICY_OUTPUT_GAIN",
    "SUPPORTED_SPACES",
    "VALUE_OUTPUT_GAIN",
    "ActionNoise",
    "CategoricalPolicy",
    "DictEncoder",
    "EnsembleLayerNorm",
    "EnsembleLinear",
    "EnsembleMLP",
    "GaussianPolicy",
    "ImageEncoder",
    "ImpalaCNN",
    "MemberActor",
    "MemberCategoricalPolicy",
    "MemberGaussianPolicy",
    "MemberNoise",
    "MemberValueNet",
    "MultiCategoricalPolicy",
    "NatureCNN",
    "Tensor",
    "ValueNet",
    "activation_class",
    "conv_init",
    "encoder_observation_rank",
    "feature_encoder",
    "head_encoder",
    "head_mlp",
    "head_on_features",
    "image_layout",
    "is_image_space",
    "layer_init",
    "log_softmax_actions_first",
    "mlp",
    "multi_discrete_sizes",
    "obs_dim",
    "observation_kind",
    "observation_shape",
]
