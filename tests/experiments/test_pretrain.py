"""Stage 0 (winpos.experiments.pretrain): per-unit targets, the masking, the reliance readouts (an exactly
window-periodic embedding rolled by one window must give the very same loss, rolled by one token another one),
and a short training run from a random start."""
import pytest
import torch

from winpos.backbones import create
from winpos.errors import WinposError
from winpos.experiments import pretrain as S0

MEAN, STD = [123.675, 116.28, 103.53], [58.395, 57.12, 57.375]


def toy_net():
    torch.manual_seed(0)
    return create("hieradet_toy", "original", embed_dim=16, num_heads=1, window_spec=(4, 2, 0, 2), img_size=64,
                  pretrain_img_size=64, pos_embed="abs", drop_path_rate=0.0)


def test_unit_targets_are_the_token_colours_of_each_unit_normalised_over_the_unit():
    x = torch.randn(2, 3, 64, 64)
    t = S0.unit_targets(x)
    assert t.shape == (2, 4, 4, 48)
    torch.testing.assert_close(t.mean(-1), torch.zeros(2, 4, 4), atol=1e-5, rtol=0)
    torch.testing.assert_close(t.var(-1), torch.ones(2, 4, 4), atol=1e-3, rtol=0)
    # unit (1, 2), token (3, 0), green: the mean of its 4x4 pixels, before the per-unit normalisation
    raw = x[0, 1, 16 + 12:16 + 16, 32:36].mean()
    unit = torch.nn.functional.avg_pool2d(x, 4)[0, :, 4:8, 8:12].permute(1, 2, 0).reshape(-1)
    assert t[0, 1, 2, (3 * 4 + 0) * 3 + 1] == pytest.approx(((raw - unit.mean()) / (unit.var() + 1e-6).sqrt()).item(),
                                                           abs=1e-4)


def test_masks_hold_the_asked_share_of_units():
    m = S0._masks(torch.Generator().manual_seed(0), 5, 4, 4, 0.5)
    assert m.shape == (5, 4, 4) and (m.sum((1, 2)) == 8).all()


def test_reliance_rolls_by_a_window_back_into_alignment():
    net = toy_net()
    pe = net.pos_embed.pos_embed  # (1, 256, C)
    tile = torch.randn(4, 4, pe.shape[-1])
    with torch.no_grad():
        pe.copy_(tile.repeat(4, 4, 1).reshape(1, 256, -1))  # exactly 4-periodic
    spec = S0.PretrainSpec(iters=1, mask_ratio=0.5, images=300)
    stage = S0.Stage0(net, spec)
    imgs = torch.randint(0, 256, (300, 64, 64, 3), dtype=torch.uint8)
    mean, std = torch.tensor(MEAN).view(1, 3, 1, 1), torch.tensor(STD).view(1, 3, 1, 1)
    r = S0.reliance(stage, imgs, mean, std, n=64)
    assert r["rolled_1_window"] == r["learned"]  # the same embedding: the same loss, exactly
    assert r["rolled_1_token"] != r["learned"] and r["zeroed"] != r["learned"]
    torch.testing.assert_close(pe.detach()[0].reshape(4, 4, 4, 4, -1)[0, :, 0], tile)  # restored after the readout
    assert S0.window_ws(net) == pytest.approx(1.0, abs=1e-6)


def test_a_short_stage0_run_from_a_random_start(tmp_path):
    net = toy_net()
    before = net.pos_embed.pos_embed.detach().clone()
    spec = S0.PretrainSpec(iters=12, batch=4, images=280, mask_ratio=0.5, loss_on="all", log_every=6)
    lines = []
    out = S0.pretrain(net, spec, MEAN, STD, image_cache=str(tmp_path / "imgs.npy"),
                      progress=lambda i, n, line: lines.append(line))
    assert [h["iter"] for h in out["history"]] == [0, 6, 12] and len(lines) == 2
    assert abs(out["history"][0]["ws"]) < 0.1  # a random start has no window pattern
    assert set(out["reliance"]) == {"learned", "zeroed", "rolled_1_token", "rolled_1_window"}
    assert not torch.equal(before, net.pos_embed.pos_embed.detach())
    assert (tmp_path / "imgs.npy").is_file()
    again = S0.make_images(spec, str(tmp_path / "imgs.npy"))  # the cache gives the same images
    assert again.shape == (280, 64, 64, 3) and again.dtype == torch.uint8


@pytest.mark.parametrize("kwargs,message", [
    (dict(iters=0), "iters=0 must be a positive int"),
    (dict(mask_ratio=1.0), "mask_ratio=1.0 must be in"),
    (dict(loss_on="visible"), "loss_on='visible' must be"),
    (dict(loss_on="masked", mask_ratio=0.0), "needs mask_ratio > 0"),
    (dict(image_size=72), "multiple of 16 px"),
])
def test_stage0_settings_are_checked(kwargs, message):
    with pytest.raises(WinposError, match=message):
        S0.PretrainSpec(**kwargs).validate()


def test_window_similarity_needs_a_learned_absolute_embedding():
    net = create("hieradet_toy", "original", embed_dim=16, num_heads=1, img_size=64, pretrain_img_size=64,
                 pos_embed="abswin")
    with pytest.raises(WinposError, match="pos_embed='abs'"):
        S0.model_embedding_grid(net)
    assert S0.window_ws(net) is None  # stage 0 of an encoding without one reports no WS
