"""convert_config: a NEL 0.2.6 config as a nel-next (nemo-evaluator >= 0.3) config, every field accounted for.

The mapping is nel-next's knowledge (engines/nel_next/convert.py); this tool writes the result to a new file only and
checks it with validate_config, which runs nel-next's own schema (its pydantic EvalConfig) and our chain rules.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from quanteval import configfile, engines, paths
from quanteval.engines.nel_next import convert
from quanteval.engines.nel_next.configrole import owns as nel_next_config
from quanteval.engines.nel_next.convert import MappedField, UnmappedField
from quanteval.models import StrictModel, ToolError
from quanteval.workflow.validation import ValidateConfigInput, validate_config


class ConvertConfigInput(StrictModel):
    config_path: str = Field(description="The NEL 0.2.6 config (.yaml) to convert.")
    output_path: str = Field(description="New nel-next config file (.yaml); never overwritten.")


class ConvertConfigOutput(BaseModel):
    output_path: str
    mapped: list[MappedField]
    unmapped: list[UnmappedField] = Field(description="Every NEL value not carried over, with why; review before running.")
    valid: bool = Field(description="validate_config (nel-next's schema and our rules) found no error.")
    problems: list[dict[str, Any]] = Field(description="validate_config's problems on the result.")
    missing_values: list[str] = Field(description="nel-next keys still ??? (fill them with set_config_value or apply_checkpoint).")


def convert_config(request: ConvertConfigInput) -> ConvertConfigOutput:
    """Use to move a NEL 0.2.6 config to nel-next: writes a new config, lists each field mapped or not carried over (with
    why) and validates it.
    """
    doc = configfile.to_plain(engines.load_config(request.config_path))
    if nel_next_config(doc):
        raise ToolError(f"{request.config_path}: already a nel-next config (services/benchmarks); nothing to convert.")
    target = Path(request.output_path).expanduser()
    if target.suffix not in (".yaml", ".yml"):
        raise ToolError(f"output_path: {target} must name a .yaml file.")
    conversion, unmapped = convert.convert(doc)
    text = configfile.dump_config(configfile.as_round_trip(conversion.out))
    paths.new_file_folder(target, "output_path")
    header = f"# nel-next config converted by quanteval convert_config from {Path(request.config_path).name}.\n"
    try:
        with open(target, "x", encoding="utf-8") as handle:
            handle.write(header + text)
    except FileExistsError:
        raise ToolError(f"{target}: already exists; convert_config never overwrites a file. Choose another output_path.") from None
    report = validate_config(ValidateConfigInput(config_path=str(target)))
    return ConvertConfigOutput(output_path=str(target.resolve()), mapped=conversion.mapped, unmapped=unmapped, valid=report.valid,
                               problems=[p.model_dump(mode="json") for p in report.problems],
                               missing_values=configfile.missing_value_paths(conversion.out))
