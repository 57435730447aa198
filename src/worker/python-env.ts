// Which Python runs the model worker, and with what environment: the
// interpreter is opts.python, else $BATON_PYTHON, else <repo>/.venv/bin/python
// (made by `npm run setup`); <repo>/python is prepended to PYTHONPATH so
// `python -m baton_worker` finds the package without installing it.

import { accessSync, constants, existsSync, statSync } from "node:fs";
import { delimiter, isAbsolute, join, resolve } from "node:path";
import { packageRoot } from "../transport/package-root.js";
import { WorkerStartError } from "./types.js";

export interface PythonEnv {
  /** Absolute path of the interpreter, or a bare command name found on PATH. */
  python: string;
  /** Where the choice came from, for error messages. */
  source: "option" | "BATON_PYTHON" | ".venv";
  env: NodeJS.ProcessEnv;
}

const workerPythonDir: string = join(packageRoot, "python");
const defaultVenvPython: string = join(packageRoot, ".venv", "bin", "python");

function isExecutableFile(path: string): boolean {
  try {
    if (!statSync(path).isFile()) return false;
    accessSync(path, constants.X_OK);
    return true;
  } catch {
    return false;
  }
}

function findOnPath(command: string, pathVar: string | undefined): string | null {
  for (const dir of (pathVar ?? "").split(delimiter)) {
    if (dir !== "" && isExecutableFile(join(dir, command))) return join(dir, command);
  }
  return null;
}

/**
 * Resolves the interpreter and environment for the worker. Throws
 * WorkerStartError with a how-to-fix message when the interpreter is missing.
 */
export function resolvePythonEnv(explicit?: string, baseEnv: NodeJS.ProcessEnv = process.env): PythonEnv {
  const fromEnv = baseEnv.BATON_PYTHON;
  const source: PythonEnv["source"] = explicit ? "option" : fromEnv ? "BATON_PYTHON" : ".venv";
  const requested = explicit || fromEnv || defaultVenvPython;

  let python: string | null;
  if (requested.includes("/")) python = isExecutableFile(resolve(requested)) ? resolve(requested) : null;
  else python = findOnPath(requested, baseEnv.PATH);

  if (python === null) {
    const hint =
      source === ".venv"
        ? `run "npm run setup" to create ${join(packageRoot, ".venv")}, or set BATON_PYTHON to a Python that has torch`
        : source === "BATON_PYTHON"
          ? `BATON_PYTHON=${requested} is not an executable file or a command on PATH (run "npm run setup" after fixing it)`
          : "pass the path of a Python interpreter that has torch";
    throw new WorkerStartError(`Python interpreter not found: ${requested} (${hint})`, null);
  }
  if (!existsSync(join(workerPythonDir, "baton_worker"))) {
    throw new WorkerStartError(`the worker package is missing: ${join(workerPythonDir, "baton_worker")}`, null);
  }

  const pythonPath = baseEnv.PYTHONPATH ? `${workerPythonDir}${delimiter}${baseEnv.PYTHONPATH}` : workerPythonDir;
  // Unbuffered so the worker's log lines (and a traceback before a crash) reach us promptly.
  const env: NodeJS.ProcessEnv = { ...baseEnv, PYTHONPATH: pythonPath, PYTHONUNBUFFERED: "1" };
  return { python: isAbsolute(python) ? python : resolve(python), source, env };
}
