"""Small helpers shared by the tests (imported as ``from helpers import ...``)."""
from earlyexit.engine import DecodeConfig, decode


def gen(model, prompts, max_new_tokens, rule="full", strategy="naive-mask", rule_kw=None, **kw):
    """``decode`` with an early-exit configuration given as (rule, strategy, rule arguments)."""
    return decode(model, prompts, DecodeConfig.early_exit(rule, strategy, **(rule_kw or {})), max_new_tokens, **kw)


def spec(model, ids, n, E, d, **kw):
    """Self-speculative decoding of one prompt through the front door."""
    return decode(model, [ids], DecodeConfig.self_speculation(E, d), n, **kw)


FIGURE_REPO_FIGS = (("02_scene", "02_naive_collapse"), ("08_pareto", "08_comparison"))


def figure_repo(root, config_yml: str = "title: x\n", commit: str = "a" * 40, figs=FIGURE_REPO_FIGS):
    """A repository root at ``root`` for the citation tests: pyproject (version 1.2.3), the project's
    CITATION.cff at that version, ``config_yml`` as _config.yml, and two real figures (with provenance made at
    ``commit``) under figures/. Returns ``root``."""
    import matplotlib
    import yaml

    from earlyexit import paths
    from earlyexit.book import figures, provenance

    matplotlib.use("Agg")
    (root / "pyproject.toml").write_text('[project]\nname = "earlyexit"\nversion = "1.2.3"\n')
    cff = yaml.safe_load((paths.REPO_ROOT / "CITATION.cff").read_text())
    cff.update({"version": "1.2.3", "date-released": "2026-01-15"})
    (root / "CITATION.cff").write_text(yaml.safe_dump(cff, sort_keys=False))
    (root / "_config.yml").write_text(config_yml)
    out = root / "figures"
    out.mkdir()
    for name, nb in figs:
        fig, ax = figures.subplots()
        ax.plot([0, 1], [1, 0])
        prov = {**provenance.collect({"profile": "smoke"}, notebook=nb), "git_commit": commit, "git_dirty": False}
        figures.save_figure(fig, name, prov, directory=out)
    return root
