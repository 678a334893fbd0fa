# The model's shape: a Hugging Face Mamba (D width, K layers, N state, V vocab, E expand, conv
# W = 4, R = ceil(D/16) dt rank) and its parameter count and bytes (f32 on the wire).

from .errors import FleetError


F32 = 4                   # bytes per value: every tensor on the wire is f32 (I64 tokens: 8)


class Shape:
    """A Hugging Face Mamba shape: D width, K layers, N state, V vocab, E expand, W conv."""

    def __init__(self, D, K, N, V, E, W=4):
        if min(D, K, N, V, E, W) < 1:
            raise FleetError(f"model shape D={D} K={K} N={N} V={V} E={E} must be positive")
        self.D, self.K, self.N, self.V, self.E, self.W = D, K, N, V, E, W
        self.Di = E * D
        self.R = -(-D // 16)  # time_step_rank "auto" = ceil(D / 16)

    def __repr__(self):
        return f"D={self.D},K={self.K},N={self.N},V={self.V},E={self.E}"

    def layer_params(self):
        """Values of one layer: norm (D), in_proj (2Di, D), conv1d (Di, 1, W) + bias (Di),
        x_proj (R + 2N, Di), dt_proj (Di, R) + bias (Di), A_log (Di, N), D (Di),
        out_proj (D, Di)."""
        D, Di, N, R, W = self.D, self.Di, self.N, self.R, self.W
        return (D + 2 * Di * D + Di * W + Di + (R + 2 * N) * Di + Di * R + Di + Di * N + Di
                + D * Di)

    def embed_params(self):
        return self.V * self.D  # (V, D), tied with the LM head

    def params(self):
        return self.embed_params() + self.K * self.layer_params() + self.D  # + norm_f (D)

    def param_bytes(self):
        return F32 * self.params()


def parse_shape(text, flag="--model"):
    try:
        D, K, N, V, E = (int(x) for x in text.split(","))
    except ValueError:
        raise FleetError(f"{flag} {text!r}: expected D,K,N,V,E, five integers "
                         "(e.g. 768,24,16,50280,2)") from None
    return Shape(D, K, N, V, E)
